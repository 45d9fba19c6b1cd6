/* append-cost: the CPU (user + system) one record's append costs on this file system, the
 * way larder's volumes are written (positional writes at the log's end), for three shapes of
 * file and for records written one at a time or several in one write.
 *
 *   cc -O2 -o append-cost bench/append-cost.c
 *   ./append-cost DIR MODE RECORD_BYTES RECORDS [RECORDS_PER_WRITE]
 *
 * MODE: grow (the file grows with each write, as larder's volumes do), sized (made its full
 * length first, sparse, with ftruncate) or falloc (its blocks allocated first, fallocate).
 * Prints microseconds of CPU per record. The file is removed at the end. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static double cpu_seconds(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s DIR grow|sized|falloc RECORD_BYTES RECORDS [RECORDS_PER_WRITE]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[2];
    long rec = atol(argv[3]), n = atol(argv[4]), batch = argc > 5 ? atol(argv[5]) : 1;
    if (rec <= 0 || n <= 0 || batch <= 0) {
        fprintf(stderr, "sizes and counts must be positive\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/append-cost.vol", argv[1]);
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    long total = rec * n;
    if ((!strcmp(mode, "sized") && ftruncate(fd, total + 4096) != 0) ||
        (!strcmp(mode, "falloc") && fallocate(fd, 0, 0, total + 4096) != 0)) {
        perror("sizing the file");
        return 1;
    }
    char *buf = malloc((size_t)(rec * batch));
    memset(buf, 7, (size_t)(rec * batch));
    double c0 = cpu_seconds();
    for (long off = 0; off + rec * batch <= total; off += rec * batch) {
        if (pwrite(fd, buf, (size_t)(rec * batch), off) != rec * batch) {
            perror("pwrite");
            return 1;
        }
    }
    double c1 = cpu_seconds();
    printf("%-6s record %6ld B, %3ld a write: %.2f us of CPU a record\n", mode, rec, batch, (c1 - c0) / n * 1e6);
    close(fd);
    unlink(path);
    return 0;
}
