/* The floor: the least an HTTP/1.1 server can spend per request on this kernel. One thread,
 * epoll, non-blocking sockets; it parses nothing but the "\r\n\r\n" that ends a request head
 * and answers every request with the same fixed response (a 200 with a body of BODY bytes).
 * Every request of a pipelined batch read at once is answered in one write, as the fastest
 * servers do. bench/request-cost.py builds it and measures larder's CPU per request against it.
 *
 *   cc -O2 -o responder responder.c && ./responder PORT BODY_BYTES
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_EVENTS 256
#define READ_SIZE 65536
#define MAX_FD 65536

/* Bytes of an unfinished request head carried over to the next read, per connection. */
struct conn {
	char tail[3];
	int tail_len;
};

static struct conn conns[MAX_FD];
static char *answer;
static size_t answer_len;
static char *out;
static size_t out_cap;

/* Counts the request heads that end in buf, a marker straddling the previous read included. */
static int heads(struct conn *c, const char *buf, ssize_t n)
{
	int count = 0;
	char joint[6];
	int j = c->tail_len;
	memcpy(joint, c->tail, j);
	int take = n < 3 ? (int)n : 3;
	memcpy(joint + j, buf, take);
	j += take;
	for (int i = 0; i < c->tail_len && i + 4 <= j; i++)
		if (memcmp(joint + i, "\r\n\r\n", 4) == 0)
			count++;
	for (const char *p = buf; (p = memmem(p, buf + n - p, "\r\n\r\n", 4)) != NULL; p += 4)
		count++;
	int keep = j < 3 ? j : 3;
	if (n >= 3)
		memcpy(c->tail, buf + n - 3, 3);
	else
		memmove(c->tail, joint + j - keep, keep);
	c->tail_len = n >= 3 ? 3 : keep;
	return count;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s PORT BODY_BYTES\n", argv[0]);
		return 2;
	}
	int port = atoi(argv[1]);
	size_t body = strtoul(argv[2], NULL, 10);
	char head[256];
	int head_len = snprintf(head, sizeof head,
				"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
				"content-length: %zu\r\ndate: Fri, 27 Nov 2026 00:00:00 GMT\r\n\r\n",
				body);
	answer_len = head_len + body;
	answer = malloc(answer_len);
	memcpy(answer, head, head_len);
	memset(answer + head_len, 'x', body);

	int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(ls, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(ls, 4096) < 0) {
		perror("bind/listen");
		return 1;
	}
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
	epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
	struct epoll_event events[MAX_EVENTS];
	static char buf[READ_SIZE];
	for (;;) {
		int n = epoll_wait(ep, events, MAX_EVENTS, -1);
		for (int i = 0; i < n; i++) {
			int fd = events[i].data.fd;
			if (fd == ls) {
				int c;
				while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
					if (c >= MAX_FD) {
						close(c);
						continue;
					}
					setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
					conns[c].tail_len = 0;
					struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
					epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
				}
				continue;
			}
			ssize_t r = read(fd, buf, sizeof buf);
			if (r <= 0) {
				if (r < 0 && errno == EAGAIN)
					continue;
				close(fd);
				continue;
			}
			int count = heads(&conns[fd], buf, r);
			if (count == 0)
				continue;
			size_t need = answer_len * count;
			const char *from = answer;
			if (count > 1) {
				if (need > out_cap) {
					out = realloc(out, need);
					out_cap = need;
				}
				for (int k = 0; k < count; k++)
					memcpy(out + k * answer_len, answer, answer_len);
				from = out;
			}
			/* Loopback with small answers: the socket buffer takes it; a short write is a
			 * slow reader, which a load generator is not. */
			size_t done = 0;
			while (done < need) {
				ssize_t w = write(fd, from + done, need - done);
				if (w < 0) {
					if (errno == EAGAIN)
						continue;
					break;
				}
				done += w;
			}
		}
	}
}
