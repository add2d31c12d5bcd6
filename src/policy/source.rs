//! Reading a policy directory: files → YAML documents as JSON values, each with an
//! index from JSON pointer to the line and column it came from.
//!
//! serde_yaml gives the values; yaml-rust2's marked events give the positions, so every
//! later diagnostic (schema or semantic) can point at the exact key or value.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

use super::diagnostic::{Diagnostic, SourceRef};

/// One YAML document of a policy set.
#[derive(Debug, Clone)]
pub struct Document {
    pub file: String,
    pub value: Value,
    pub index: LocationIndex,
}

impl Document {
    /// The position of the value at `pointer`, or of its closest ancestor.
    pub fn at(&self, pointer: &str) -> SourceRef {
        self.index.lookup(&self.file, pointer, false)
    }

    /// The position of the key of the member at `pointer` (for unknown fields).
    pub fn key_at(&self, pointer: &str) -> SourceRef {
        self.index.lookup(&self.file, pointer, true)
    }

    /// The scalar text as written in the file, e.g. `0.60` for a YAML float.
    pub fn raw_scalar(&self, pointer: &str) -> Option<&str> {
        self.index.scalars.get(pointer).map(String::as_str)
    }
}

#[derive(Debug, Clone, Default)]
pub struct LocationIndex {
    values: HashMap<String, (usize, usize)>,
    keys: HashMap<String, (usize, usize)>,
    scalars: HashMap<String, String>,
    start: (usize, usize),
}

impl LocationIndex {
    fn lookup(&self, file: &str, pointer: &str, key: bool) -> SourceRef {
        let mut p = pointer;
        let mut exact = true;
        loop {
            // An ancestor is best shown by its key: a block mapping's own position is
            // its first child's line.
            let hit = if key || !exact {
                self.keys.get(p).or_else(|| self.values.get(p))
            } else {
                self.values.get(p)
            };
            if let Some(&(line, col)) = hit {
                return SourceRef {
                    file: file.to_string(),
                    line,
                    col,
                };
            }
            match p.rfind('/') {
                Some(i) => {
                    p = &p[..i];
                    exact = false;
                }
                None => {
                    return SourceRef {
                        file: file.to_string(),
                        line: self.start.0,
                        col: self.start.1,
                    };
                }
            }
        }
    }
}

/// Escape one JSON pointer segment (RFC 6901).
pub fn seg(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

enum Frame {
    Map {
        path: String,
        pending_key: Option<String>,
    },
    Seq {
        path: String,
        next: usize,
    },
}

/// Builds one `LocationIndex` per document from yaml-rust2's marked events.
#[derive(Default)]
struct Indexer {
    docs: Vec<LocationIndex>,
    stack: Vec<Frame>,
}

fn pos(m: &Marker) -> (usize, usize) {
    // yaml-rust2 columns are 0-based; editors and our messages count from 1.
    (m.line(), m.col() + 1)
}

impl Indexer {
    /// Called for every node start: records its position and returns its pointer,
    /// or `None` when the node is a mapping key.
    fn node(&mut self, mark: &Marker, scalar: Option<&str>) -> Option<String> {
        let doc = self.docs.last_mut()?;
        let path = match self.stack.last_mut() {
            None => String::new(),
            Some(Frame::Map { path, pending_key }) => match pending_key.take() {
                None => {
                    // A key: remember it, position recorded under the member's pointer.
                    let k = scalar.unwrap_or("").to_string();
                    let p = format!("{path}/{}", seg(&k));
                    doc.keys.insert(p, pos(mark));
                    *pending_key = Some(k);
                    return None;
                }
                Some(k) => format!("{path}/{}", seg(&k)),
            },
            Some(Frame::Seq { path, next }) => {
                let p = format!("{path}/{next}");
                *next += 1;
                p
            }
        };
        // The root's position is the document start, not wherever the parser noticed
        // the mapping began.
        let at = if path.is_empty() {
            (doc.start.0, 1)
        } else {
            pos(mark)
        };
        doc.values.insert(path.clone(), at);
        if let Some(s) = scalar {
            doc.scalars.insert(path.clone(), s.to_string());
        }
        Some(path)
    }
}

impl MarkedEventReceiver for Indexer {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::DocumentStart => {
                self.stack.clear();
                self.docs.push(LocationIndex {
                    start: pos(&mark),
                    ..LocationIndex::default()
                });
            }
            Event::Scalar(s, ..) => {
                self.node(&mark, Some(&s));
            }
            Event::Alias(_) => {
                self.node(&mark, None);
            }
            Event::MappingStart(..) => {
                // A mapping used as a key is not valid config; index it as a value.
                let path = self.node(&mark, None).unwrap_or_default();
                self.stack.push(Frame::Map {
                    path,
                    pending_key: None,
                });
            }
            Event::SequenceStart(..) => {
                let path = self.node(&mark, None).unwrap_or_default();
                self.stack.push(Frame::Seq { path, next: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
        }
    }
}

/// Everything read from a directory: the documents, and the problems that stopped
/// some files from being read at all.
pub struct Loaded {
    pub documents: Vec<Document>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Read every `*.yaml` / `*.yml` under `dir`, recursively, in path order.
pub fn load_dir(dir: &Path) -> Loaded {
    let mut diagnostics = Vec::new();
    let mut files = Vec::new();
    let at_dir = SourceRef {
        file: dir.display().to_string(),
        line: 1,
        col: 1,
    };
    if !dir.is_dir() {
        diagnostics.push(Diagnostic::error(
            "no-such-directory",
            at_dir,
            format!("`{}` is not a directory", dir.display()),
        ));
        return Loaded {
            documents: vec![],
            diagnostics,
        };
    }
    collect(dir, &mut files, &mut diagnostics);
    files.sort();
    if files.is_empty() {
        diagnostics.push(
            Diagnostic::error(
                "empty-directory",
                at_dir,
                format!("no *.yaml or *.yml files in `{}`", dir.display()),
            )
            .with_help("a policy set needs one `kind: gateway` document, providers and policies"),
        );
    }
    let mut documents = Vec::new();
    for path in files {
        let name = path.display().to_string();
        match std::fs::read(&path) {
            Err(e) => diagnostics.push(Diagnostic::error(
                "unreadable-file",
                SourceRef {
                    file: name,
                    line: 1,
                    col: 1,
                },
                format!("cannot read file: {e}"),
            )),
            Ok(bytes) => match String::from_utf8(bytes) {
                Err(e) => {
                    let ok = &e.as_bytes()[..e.utf8_error().valid_up_to()];
                    let line = ok.iter().filter(|b| **b == b'\n').count() + 1;
                    let col = ok.iter().rev().take_while(|b| **b != b'\n').count() + 1;
                    diagnostics.push(
                        Diagnostic::error(
                            "not-utf8",
                            SourceRef {
                                file: name,
                                line,
                                col,
                            },
                            format!(
                                "file is not valid UTF-8 (byte 0x{:02x} at offset {})",
                                e.as_bytes()[e.utf8_error().valid_up_to()],
                                e.utf8_error().valid_up_to()
                            ),
                        )
                        .with_help("save the file as UTF-8"),
                    );
                }
                Ok(text) => parse_file(&name, &text, &mut documents, &mut diagnostics),
            },
        }
    }
    Loaded {
        documents,
        diagnostics,
    }
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>, diags: &mut Vec<Diagnostic>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            diags.push(Diagnostic::error(
                "unreadable-file",
                SourceRef {
                    file: dir.display().to_string(),
                    line: 1,
                    col: 1,
                },
                format!("cannot read directory: {e}"),
            ));
            return;
        }
    };
    for entry in entries.flatten() {
        let p = entry.path();
        if p.is_dir() {
            collect(&p, out, diags);
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
}

/// Parse one file's text into documents (exposed for tests and `diff --git`).
pub fn parse_file(name: &str, text: &str, docs: &mut Vec<Document>, diags: &mut Vec<Diagnostic>) {
    let mut indexer = Indexer::default();
    // Positions are best effort: if yaml-rust2 disagrees with serde_yaml, messages fall
    // back to the document start rather than failing the compile.
    let _ = Parser::new_from_str(text).load(&mut indexer, true);
    let mut indexes = indexer.docs.into_iter();
    for de in serde_yaml::Deserializer::from_str(text) {
        let index = indexes.next().unwrap_or_default();
        match <serde_yaml::Value as serde::Deserialize>::deserialize(de) {
            Err(e) => {
                let (line, col) = e
                    .location()
                    .map(|l| (l.line(), l.column()))
                    .unwrap_or((1, 1));
                diags.push(
                    Diagnostic::error(
                        "yaml-syntax",
                        SourceRef {
                            file: name.to_string(),
                            line,
                            col,
                        },
                        format!("YAML syntax error: {}", strip_location(&e.to_string())),
                    )
                    .with_help("check indentation and quoting around this point"),
                );
                // serde_yaml cannot resume after a syntax error in a stream.
                return;
            }
            Ok(serde_yaml::Value::Null) => {}
            Ok(v) => match to_json(v) {
                Ok(value) => docs.push(Document {
                    file: name.to_string(),
                    value,
                    index,
                }),
                Err(msg) => diags.push(Diagnostic::error(
                    "yaml-unsupported",
                    index.lookup(name, "", false),
                    msg,
                )),
            },
        }
    }
}

fn strip_location(msg: &str) -> &str {
    // serde_yaml appends " at line L column C"; we print the position in front already.
    match msg.find(" at line ") {
        Some(i) => &msg[..i],
        None => msg,
    }
}

fn to_json(v: serde_yaml::Value) -> Result<Value, String> {
    use serde_yaml::Value as Y;
    Ok(match v {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                // Only reached for YAML floats, which config money never is; the schema
                // rejects them with a message that says to quote the amount.
                n.as_f64()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    .unwrap_or(Value::Null)
            }
        }
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => {
            Value::Array(items.into_iter().map(to_json).collect::<Result<_, _>>()?)
        }
        Y::Mapping(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                let key = match k {
                    Y::String(s) => s,
                    Y::Number(n) => n.to_string(),
                    Y::Bool(b) => b.to_string(),
                    other => return Err(format!("mapping keys must be strings, found {other:?}")),
                };
                out.insert(key, to_json(v)?);
            }
            Value::Object(out)
        }
        Y::Tagged(t) => return Err(format!("YAML tags are not supported (found `{}`)", t.tag)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_point_at_keys_and_values() {
        let text = "kind: policy\nceiling:\n  per_request: \"0.5\"\n  mode: hard\nlist:\n  - a\n  - b\n---\nkind: gateway\n";
        let mut docs = vec![];
        let mut diags = vec![];
        parse_file("x.yaml", text, &mut docs, &mut diags);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(docs.len(), 2);
        let d = &docs[0];
        assert_eq!(d.at("/ceiling/per_request").line, 3);
        assert_eq!(d.at("/ceiling/per_request").col, 16);
        assert_eq!(d.key_at("/ceiling/mode").col, 3);
        assert_eq!(d.at("/list/1").line, 7);
        assert_eq!(d.at("/ceiling/nope").line, 2);
        assert_eq!(docs[1].at("/kind").line, 9);
    }
}
