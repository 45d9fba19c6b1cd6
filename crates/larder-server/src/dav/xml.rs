//! WebDAV's XML (RFC 4918): a `PROPFIND` body read, and a `207 Multi-Status` written.
//!
//! The body is read as a stream of events by quick-xml, which neither reads a DTD nor expands
//! an entity. A document with a `DOCTYPE` is refused outright (so no entity, internal or
//! external, is ever defined), as is one nested deeper than [`MAX_DEPTH`], naming more than
//! [`MAX_PROPS`] properties, or naming one whose name or namespace is longer than [`MAX_NAME`]
//! or not plain (so that what is echoed back is small and always well-formed); the caller
//! bounds its size.

use quick_xml::escape::partial_escape;
use quick_xml::events::Event;
use quick_xml::name::ResolveResult;
use quick_xml::NsReader;

/// Deepest element nesting a PROPFIND body may have (a real one has 3 or 4 levels).
pub const MAX_DEPTH: usize = 16;
/// Most properties a PROPFIND may name (clients name a dozen or so).
pub const MAX_PROPS: usize = 64;
/// Longest property name, and longest namespace, in bytes.
pub const MAX_NAME: usize = 256;

const DAV: &[u8] = b"DAV:";
/// The namespaces Namespaces in XML reserves: `xml`'s, which only that prefix may name (and
/// needs no declaration), and `xmlns`'s, which nothing may name.
const XML_NS: &[u8] = b"http://www.w3.org/XML/1998/namespace";
const XMLNS_NS: &[u8] = b"http://www.w3.org/2000/xmlns/";

/// A property's name: its namespace and local name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Name {
    pub ns: Vec<u8>,
    pub local: Vec<u8>,
}

impl Name {
    fn dav(local: &str) -> Name {
        Name { ns: DAV.to_vec(), local: local.as_bytes().to_vec() }
    }
}

/// What a PROPFIND asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Want {
    /// Every property (also an empty body).
    All,
    /// The names of the properties only.
    Names,
    /// These properties.
    Props(Vec<Name>),
}

/// The request of a PROPFIND body, or the one-line reason it is refused (a 400).
pub fn parse_propfind(body: &[u8]) -> Result<Want, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Want::All);
    }
    // XML 1.0 allows no NUL and no other control character but tab, CR and LF, anywhere.
    if body.iter().any(|&b| b < 0x20 && !matches!(b, b'\t' | b'\r' | b'\n')) {
        return Err("the body holds a byte XML does not allow (NUL or another control character)".into());
    }
    let mut r = NsReader::from_reader(body);
    r.config_mut().expand_empty_elements = true;
    r.config_mut().trim_text(true);
    // The path of DAV: elements open from the root (None for any other element).
    let mut open: Vec<Option<Vec<u8>>> = Vec::new();
    let (mut want, mut root_seen) = (None, false);
    loop {
        let (ns, ev) = r.read_resolved_event().map_err(|e| format!("malformed XML: {e}"))?;
        match ev {
            Event::DocType(_) => return Err("an XML DOCTYPE is refused (no DTDs, no entities)".into()),
            Event::Start(e) => {
                if open.len() == MAX_DEPTH {
                    return Err(format!("XML nested deeper than {MAX_DEPTH} elements"));
                }
                reserved(&e)?;
                let local = e.local_name().as_ref().to_vec();
                let in_dav = matches!(ns, ResolveResult::Bound(n) if n.as_ref() == DAV);
                let depth = open.len();
                let parent = open.last().cloned().flatten();
                match (depth, parent.as_deref()) {
                    (0, _) => {
                        if root_seen || !(in_dav && local == b"propfind") {
                            return Err("the body of a PROPFIND must be one DAV:propfind element".into());
                        }
                        root_seen = true;
                    }
                    (1, Some(b"propfind")) if in_dav => match &local[..] {
                        b"allprop" => want = want.or(Some(Want::All)),
                        b"propname" => want = Some(Want::Names),
                        b"prop" => want = Some(Want::Props(Vec::new())),
                        _ => {} // DAV:include and extensions: nothing larder keeps
                    },
                    (2, Some(b"prop")) => {
                        if let Some(Want::Props(names)) = &mut want {
                            if names.len() == MAX_PROPS {
                                return Err(format!("a PROPFIND may name at most {MAX_PROPS} properties"));
                            }
                            let ns = match ns {
                                ResolveResult::Bound(n) => n.as_ref().to_vec(),
                                ResolveResult::Unbound => Vec::new(),
                                ResolveResult::Unknown(p) => {
                                    return Err(format!("undeclared XML prefix {:?}", String::from_utf8_lossy(&p)))
                                }
                            };
                            plain(&local, &ns)?;
                            names.push(Name { ns, local: local.clone() });
                        }
                    }
                    _ => {}
                }
                open.push(in_dav.then_some(local));
            }
            Event::End(_) => {
                open.pop();
            }
            Event::Text(_) | Event::CData(_) | Event::GeneralRef(_) if open.is_empty() => {
                return Err("malformed XML: text outside the root element".into())
            }
            Event::Eof if open.is_empty() => break,
            Event::Eof => return Err("malformed XML: the document ends inside an element".into()),
            // Text, comments, processing instructions, CDATA and references are read past:
            // none of them means anything in a PROPFIND, and no reference is expanded.
            _ => {}
        }
    }
    match (root_seen, want) {
        (false, _) => Err("the body of a PROPFIND must be one DAV:propfind element".into()),
        (true, None) => Err("a DAV:propfind needs DAV:allprop, DAV:propname or DAV:prop".into()),
        (true, Some(w)) => Ok(w),
    }
}

/// Refuses what Namespaces in XML calls ill-formed, which a 207 would echo: an element with
/// the prefix `xmlns`, a declaration of the `xmlns` namespace, or of `xml`'s under any other
/// prefix (or of `xml` as another namespace).
fn reserved(e: &quick_xml::events::BytesStart<'_>) -> Result<(), String> {
    if e.name().prefix().is_some_and(|p| p.as_ref() == b"xmlns") {
        return Err("malformed XML: an element may not have the prefix xmlns".into());
    }
    for a in e.attributes() {
        let a = a.map_err(|e| format!("malformed XML: {e}"))?;
        let key = a.key.as_ref();
        let prefix = match key.strip_prefix(b"xmlns") {
            Some([]) => None,
            Some([b':', p @ ..]) => Some(p),
            _ => continue,
        };
        let ns = &a.value[..];
        let ok = match prefix {
            Some(b"xml") => ns == XML_NS,
            Some(b"xmlns") => false,
            _ => ns != XML_NS && ns != XMLNS_NS,
        };
        if !ok {
            return Err("malformed XML: a reserved prefix or namespace (xml, xmlns) is declared".into());
        }
    }
    Ok(())
}

/// A property's name and namespace are written back as they came: each must be short, the
/// name an ASCII XML name, the namespace free of what would need escaping.
fn plain(local: &[u8], ns: &[u8]) -> Result<(), String> {
    let name_ok = local.first().is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
        && local.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    let ns_ok = ns.iter().all(|b| b.is_ascii_graphic() && !matches!(b, b'&' | b'<' | b'>' | b'"' | b'\''));
    match (local.len() <= MAX_NAME && name_ok, ns.len() <= MAX_NAME && ns_ok) {
        (true, true) => Ok(()),
        (false, _) => Err(format!("a property name must be an ASCII XML name of at most {MAX_NAME} bytes")),
        (_, false) => Err(format!("a property namespace must be a plain URI of at most {MAX_NAME} bytes")),
    }
}

/// A resource as a PROPFIND answers for it.
pub struct Resource {
    /// Its `href`: already percent-encoded (it is XML-escaped here).
    pub href: String,
    pub collection: bool,
    pub len: Option<u64>,
    pub etag: Option<String>,
    /// An HTTP date.
    pub modified: Option<String>,
    pub content_type: Option<String>,
}

impl Resource {
    /// The properties it has, as (name, value written inside the element).
    fn props(&self) -> Vec<(&'static str, String)> {
        let mut p = vec![("resourcetype", if self.collection { "<D:collection/>".to_string() } else { String::new() })];
        if let Some(n) = self.len {
            p.push(("getcontentlength", n.to_string()));
        }
        if let Some(e) = &self.etag {
            p.push(("getetag", partial_escape(e.as_str()).into_owned()));
        }
        if let Some(m) = &self.modified {
            p.push(("getlastmodified", partial_escape(m.as_str()).into_owned()));
        }
        if let Some(t) = &self.content_type {
            p.push(("getcontenttype", partial_escape(t.as_str()).into_owned()));
        }
        p
    }
}

/// The start of a 207 body.
pub fn open_multistatus() -> String {
    "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<D:multistatus xmlns:D=\"DAV:\">\n".to_string()
}

pub fn close_multistatus(out: &mut String) {
    out.push_str("</D:multistatus>\n");
}

/// One `response` element: the properties `want` asks for that `r` has, under 200; those it
/// asked for and `r` lacks, under 404.
pub fn response(out: &mut String, r: &Resource, want: &Want) {
    out.push_str("<D:response><D:href>");
    out.push_str(&partial_escape(r.href.as_str()));
    out.push_str("</D:href>");
    let props = r.props();
    let (mut found, mut missing) = (String::new(), String::new());
    match want {
        Want::All => props.iter().for_each(|(n, v)| element(&mut found, n, v)),
        Want::Names => props.iter().for_each(|(n, _)| element(&mut found, n, "")),
        Want::Props(names) => {
            for name in names {
                let have = props.iter().find(|(n, _)| name == &Name::dav(n));
                match have {
                    Some((n, v)) => element(&mut found, n, v),
                    None => foreign(&mut missing, name),
                }
            }
        }
    }
    propstat(out, &found, "200 OK");
    if !missing.is_empty() {
        propstat(out, &missing, "404 Not Found");
    }
    out.push_str("</D:response>\n");
}

fn propstat(out: &mut String, props: &str, status: &str) {
    out.push_str("<D:propstat><D:prop>");
    out.push_str(props);
    out.push_str("</D:prop><D:status>HTTP/1.1 ");
    out.push_str(status);
    out.push_str("</D:status></D:propstat>");
}

fn element(out: &mut String, name: &str, value: &str) {
    match value.is_empty() {
        true => out.push_str(&format!("<D:{name}/>")),
        false => out.push_str(&format!("<D:{name}>{value}</D:{name}>")),
    }
}

/// A property named by the client, written back empty in its own namespace ([`plain`] made
/// sure that neither needs escaping).
fn foreign(out: &mut String, name: &Name) {
    let local = String::from_utf8_lossy(&name.local);
    match (&name.ns[..], name.ns.is_empty()) {
        (DAV, _) => out.push_str(&format!("<D:{local}/>")),
        // Only its own prefix may name `xml`'s namespace, declared by no one.
        (XML_NS, _) => out.push_str(&format!("<xml:{local}/>")),
        (_, true) => out.push_str(&format!("<{local} xmlns=\"\"/>")),
        (ns, false) => {
            let ns = String::from_utf8_lossy(ns);
            out.push_str(&format!("<x:{local} xmlns:x=\"{ns}\"/>"));
        }
    }
}

/// The body of a 403 for `Depth: infinity` on a collection (RFC 4918 §9.1).
pub const FINITE_DEPTH: &str =
    "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<D:error xmlns:D=\"DAV:\"><D:propfind-finite-depth/></D:error>\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_clients_send() {
        assert_eq!(parse_propfind(b"").unwrap(), Want::All);
        let allprop = br#"<?xml version="1.0"?><d:propfind xmlns:d="DAV:"><d:allprop/></d:propfind>"#;
        assert_eq!(parse_propfind(allprop).unwrap(), Want::All);
        let names = br#"<propfind xmlns="DAV:"><propname/></propfind>"#;
        assert_eq!(parse_propfind(names).unwrap(), Want::Names);
        // rclone's body: DAV: properties and one of ownCloud's.
        let rclone = br#"<?xml version="1.0"?>
<d:propfind xmlns:d="DAV:" xmlns:oc="http://owncloud.org/ns">
 <d:prop><d:displayname /><d:getlastmodified /><d:getcontentlength /><oc:checksums /></d:prop>
</d:propfind>"#;
        let Want::Props(p) = parse_propfind(rclone).unwrap() else { panic!() };
        assert_eq!(p.len(), 4);
        assert_eq!(p[1], Name::dav("getlastmodified"));
        assert_eq!(p[3], Name { ns: b"http://owncloud.org/ns".to_vec(), local: b"checksums".to_vec() });
    }

    #[test]
    fn refuses_hostile_and_wrong_documents() {
        let bomb = br#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]><D:propfind xmlns:D="DAV:"><D:prop><D:x>&lol2;</D:x></D:prop></D:propfind>"#;
        assert!(parse_propfind(bomb).unwrap_err().contains("DOCTYPE"));
        let xxe = br#"<?xml version="1.0"?><!DOCTYPE d [<!ENTITY e SYSTEM "file:///etc/passwd">]><D:propfind xmlns:D="DAV:"><D:allprop/></D:propfind>"#;
        assert!(parse_propfind(xxe).unwrap_err().contains("DOCTYPE"));
        let deep = format!(
            r#"<D:propfind xmlns:D="DAV:"><D:prop>{}{}</D:prop></D:propfind>"#,
            "<a>".repeat(40),
            "</a>".repeat(40)
        );
        assert!(parse_propfind(deep.as_bytes()).unwrap_err().contains("deeper"));
        let many = format!(r#"<D:propfind xmlns:D="DAV:"><D:prop>{}</D:prop></D:propfind>"#, "<D:x/>".repeat(65));
        assert!(parse_propfind(many.as_bytes()).unwrap_err().contains("at most"));
        // What would be echoed back must be small and need no escaping.
        let ns = "n".repeat(300);
        let wide_ns = format!(r#"<D:propfind xmlns:D="DAV:" xmlns:x="urn:{ns}"><D:prop><x:a/></D:prop></D:propfind>"#);
        assert!(parse_propfind(wide_ns.as_bytes()).unwrap_err().contains("namespace"));
        let amp_ns = r#"<D:propfind xmlns:D="DAV:" xmlns:x="urn:a&amp;b"><D:prop><x:a/></D:prop></D:propfind>"#;
        assert!(parse_propfind(amp_ns.as_bytes()).unwrap_err().contains("namespace"));
        let long = format!(r#"<D:propfind xmlns:D="DAV:"><D:prop><D:{}/></D:prop></D:propfind>"#, "n".repeat(300));
        assert!(parse_propfind(long.as_bytes()).unwrap_err().contains("property name"));
        let odd = "<D:propfind xmlns:D=\"DAV:\"><D:prop><D:a\u{1}b/></D:prop></D:propfind>";
        assert!(parse_propfind(odd.as_bytes()).is_err());
        assert!(parse_propfind(b"<propfind><allprop/></propfind>").is_err(), "not in DAV:");
        assert!(parse_propfind(br#"<D:propfind xmlns:D="DAV:"><D:allprop></D:propfind>"#).is_err());
        assert!(parse_propfind(br#"<D:propfind xmlns:D="DAV:"/>"#).is_err());
        assert!(parse_propfind(br#"<D:propfind xmlns:D="DAV:"><x:y/></D:propfind>"#).is_err(), "unbound prefix");
        assert!(parse_propfind(b"not xml at all").is_err());
        // Ill-formed by Namespaces in XML, or by XML 1.0 itself (issue 39, defect 5).
        let prop = |inner: &str, decl: &str| {
            format!(r#"<D:propfind xmlns:D="DAV:"{decl}><D:prop>{inner}</D:prop></D:propfind>"#)
        };
        for bad in [
            prop("<xmlns:foo/>", ""),
            prop("<p:lang/>", r#" xmlns:p="http://www.w3.org/XML/1998/namespace""#),
            prop("<p:a/>", r#" xmlns:p="http://www.w3.org/2000/xmlns/""#),
            prop("<xml:a/>", r#" xmlns:xml="urn:other""#),
            prop("<D:getetag/>", "") + "trailing text",
            prop("<D:getetag/>", "") + "<!-- fine --><?pi fine?>&amp;",
            "text first".to_string() + &prop("<D:getetag/>", ""),
            prop("<D:getetag/>\0", ""),
            prop("<D:getetag/>", "").replace("getetag", "get\u{0}etag"),
        ] {
            assert!(parse_propfind(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let trailing_comment = prop("<D:getetag/>", "") + "\n<!-- fine -->\n";
        assert!(parse_propfind(trailing_comment.as_bytes()).is_ok());
    }

    /// `xml:lang` is a well-formed name to ask for: echoed under the `xml` prefix, which no
    /// one may declare, so a namespace-aware parser reads the 207 (issue 39, defect 5).
    #[test]
    fn a_property_in_the_xml_namespace_is_echoed_well_formed() {
        let body = r#"<D:propfind xmlns:D="DAV:"><D:prop><xml:lang/></D:prop></D:propfind>"#;
        let want = parse_propfind(body.as_bytes()).unwrap();
        assert_eq!(want, Want::Props(vec![Name { ns: XML_NS.to_vec(), local: b"lang".to_vec() }]));
        let r = Resource {
            href: "/k".into(),
            collection: false,
            len: None,
            etag: None,
            modified: None,
            content_type: None,
        };
        let mut out = open_multistatus();
        response(&mut out, &r, &want);
        close_multistatus(&mut out);
        assert!(out.contains("<xml:lang/>"), "{out}");
        let mut r = NsReader::from_reader(out.as_bytes());
        loop {
            let (ns, ev) = r.read_resolved_event().unwrap();
            if let Event::Start(e) = &ev {
                reserved(e).unwrap();
                assert!(!matches!(ns, ResolveResult::Unknown(_)), "{out}");
            }
            if matches!(ev, Event::Eof) {
                break;
            }
        }
    }

    #[test]
    fn writes_found_and_missing_properties_apart() {
        let r = Resource {
            href: "/a%20b&c".into(),
            collection: false,
            len: Some(5),
            etag: Some("\"5-x\"".into()),
            modified: Some("Thu, 26 Nov 2026 10:00:00 GMT".into()),
            content_type: None,
        };
        let want = Want::Props(vec![
            Name::dav("getcontentlength"),
            Name::dav("getcontenttype"),
            Name { ns: b"urn:x".to_vec(), local: b"y".to_vec() },
        ]);
        let mut out = open_multistatus();
        response(&mut out, &r, &want);
        close_multistatus(&mut out);
        assert!(out.contains("<D:href>/a%20b&amp;c</D:href>"), "{out}");
        assert!(out.contains("<D:prop><D:getcontentlength>5</D:getcontentlength></D:prop><D:status>HTTP/1.1 200 OK"));
        assert!(out
            .contains(r#"<D:prop><D:getcontenttype/><x:y xmlns:x="urn:x"/></D:prop><D:status>HTTP/1.1 404 Not Found"#));
        // What it writes reads back as XML.
        let mut r = NsReader::from_reader(out.as_bytes());
        while !matches!(r.read_resolved_event().unwrap().1, Event::Eof) {}
    }
}
