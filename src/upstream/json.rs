//! Compact JSON for the bodies purser sends, byte for byte what `serde_json::to_vec`
//! writes, without its per-byte string loop.
//!
//! A coding agent's turn is tens of kilobytes of prompt in a few strings, and every
//! call serializes it once. `serde_json` escapes a string one byte at a time (a table
//! lookup and a branch per byte): with a 64 kB prompt that loop was a fifth of the
//! request's CPU in the gateway, and growing its buffer by doubling another tenth
//! (perf, c=256 on the instant mock). Here a string is scanned eight bytes at a time
//! for the three kinds of byte JSON escapes (below 0x20, `"` and `\`), runs without
//! one are copied whole, and the buffer is sized once from the tree. The escapes are
//! serde_json's own (`\n`, `\u001f`, ...), numbers are written by serde_json, and a
//! property test holds the output equal to `serde_json::to_vec` for any tree.

use serde_json::Value;

/// `v` as compact JSON.
pub fn to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(size_hint(v));
    write_value(&mut out, v);
    out
}

/// An object of borrowed fields, in the order given, as compact JSON.
pub fn fields_to_vec<'a>(fields: impl Iterator<Item = (&'a str, &'a Value)> + Clone) -> Vec<u8> {
    let mut out = Vec::with_capacity(object_hint(fields.clone()));
    write_object(&mut out, fields);
    out
}

/// About the serialized length of `v`, without reading its strings' bytes: their
/// lengths and a little per value. Short only by escapes, which few strings carry.
fn size_hint(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 20,
        Value::String(s) => s.len() + 2,
        Value::Array(a) => 2 + a.iter().map(|x| size_hint(x) + 1).sum::<usize>(),
        Value::Object(o) => object_hint(o.iter().map(|(k, x)| (k.as_str(), x))),
    }
}

fn object_hint<'a>(fields: impl Iterator<Item = (&'a str, &'a Value)>) -> usize {
    2 + fields
        .map(|(k, x)| k.len() + 4 + size_hint(x))
        .sum::<usize>()
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // serde_json's own digits (itoa, ryu). Writing to a Vec cannot fail, nor can a
        // Number (never NaN nor infinite); were it to, `null` is what serde_json
        // writes for a float it cannot.
        Value::Number(n) => {
            let at = out.len();
            if serde_json::to_writer(&mut *out, n).is_err() {
                out.truncate(at);
                out.extend_from_slice(b"null");
            }
        }
        Value::String(s) => write_str(out, s),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, x);
            }
            out.push(b']');
        }
        Value::Object(o) => write_object(out, o.iter().map(|(k, x)| (k.as_str(), x))),
    }
}

fn write_object<'a>(out: &mut Vec<u8>, fields: impl Iterator<Item = (&'a str, &'a Value)>) {
    out.push(b'{');
    for (i, (k, x)) in fields.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, k);
        out.push(b':');
        write_value(out, x);
    }
    out.push(b'}');
}

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// Whether any byte of `w` is below 0x20, `"` or `\` (exact: a byte the bit tricks
/// flag wrongly is only ever beside one that is really there).
fn needs_escape(w: u64) -> bool {
    let below_space = w.wrapping_sub(ONES * 0x20) & !w;
    let q = w ^ (ONES * u64::from(b'"'));
    let quote = q.wrapping_sub(ONES) & !q;
    let b = w ^ (ONES * u64::from(b'\\'));
    let backslash = b.wrapping_sub(ONES) & !b;
    (below_space | quote | backslash) & HIGHS != 0
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.push(b'"');
    let mut run = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(chunk) = bytes.get(i..i + 8)
            && let Ok(word) = <[u8; 8]>::try_from(chunk)
            && !needs_escape(u64::from_ne_bytes(word))
        {
            i += 8;
            continue;
        }
        let byte = bytes[i];
        if byte < 0x20 || byte == b'"' || byte == b'\\' {
            out.extend_from_slice(&bytes[run..i]);
            push_escape(out, byte);
            run = i + 1;
        }
        i += 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// serde_json's escape of a byte below 0x20, `"` or `\`.
fn push_escape(out: &mut Vec<u8>, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let short: &[u8] = match byte {
        b'"' => b"\\\"",
        b'\\' => b"\\\\",
        0x08 => b"\\b",
        b'\t' => b"\\t",
        b'\n' => b"\\n",
        0x0c => b"\\f",
        b'\r' => b"\\r",
        _ => {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
            return;
        }
    };
    out.extend_from_slice(short);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn every_byte_escapes_as_serde_json_escapes_it() {
        let all: String = (0u8..=0x7f).map(char::from).collect();
        for s in [
            all.clone(),
            all.repeat(3),
            format!("{all}é中😀"),
            "plain text of more than eight bytes".into(),
        ] {
            for cut in 0..s.len().min(40) {
                let Some(t) = s.get(cut..) else { continue };
                let v = Value::String(t.to_string());
                assert_eq!(to_vec(&v), serde_json::to_vec(&v).unwrap(), "{t:?}");
            }
        }
    }

    #[test]
    fn the_word_test_finds_every_byte_that_needs_an_escape() {
        for background in [b'a', b' ', b'!', 0x7f, 0x80, 0xc3, 0xff] {
            for at in 0..8 {
                for byte in 0..=255u8 {
                    let mut word = [background; 8];
                    word[at] = byte;
                    let want = word.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
                    assert_eq!(needs_escape(u64::from_ne_bytes(word)), want, "{word:?}");
                }
            }
        }
    }

    /// Borrows between lanes need two bytes that differ from the background: every
    /// pair of edge bytes at every pair of positions.
    #[test]
    fn the_word_test_holds_for_two_bytes_at_once() {
        let edges = [
            0x00, 0x01, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x5b, 0x5c, 0x5d, 0x7f, 0x80, 0xa2, 0xdc,
            0xff,
        ];
        for background in [b'a', b' ', 0x80, 0xff] {
            for i in 0..8 {
                for j in i + 1..8 {
                    for x in edges {
                        for y in edges {
                            let mut word = [background; 8];
                            word[i] = x;
                            word[j] = y;
                            let want = word.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
                            assert_eq!(needs_escape(u64::from_ne_bytes(word)), want, "{word:?}");
                        }
                    }
                }
            }
        }
    }

    /// `overlay` writes the keys in the order serde_json writes the edited tree's: a
    /// `Map` is sorted (no `preserve_order` anywhere in the build), and so is the
    /// overlay's `BTreeMap`, for any key.
    #[test]
    fn an_overlay_writes_what_the_edited_tree_would() {
        let mut unordered = serde_json::Map::new();
        for k in ["z", "a", "M"] {
            unordered.insert(k.into(), Value::Null);
        }
        let keys: Vec<&String> = unordered.keys().collect();
        assert_eq!(
            keys,
            ["M", "a", "z"],
            "serde_json's Map no longer sorts its keys"
        );
        let body = json!({"": 1, "Model": "x", "model": "m", "a\"b": [1, "\u{7f}"],
            "é": {"\n": true}, "\u{ffff}": null, "\u{10000}": 2.5, "stream": false});
        let set = [
            ("model", json!("gpt-x")),
            ("stream", json!(true)),
            ("new\"key", json!({})),
        ];
        let remove = ["é", "absent", "stream"];
        let mut edited = body.as_object().unwrap().clone();
        for k in remove {
            edited.remove(k);
        }
        for (k, v) in &set {
            edited.insert((*k).to_string(), v.clone());
        }
        let sent = crate::upstream::overlay(&body, &set, &remove).into_bytes();
        assert_eq!(sent, serde_json::to_vec(&Value::Object(edited)).unwrap());
    }

    #[test]
    fn a_body_is_written_as_serde_json_writes_it() {
        let v = json!({
            "model": "gpt-4o", "max_completion_tokens": 128000, "temperature": 0.7,
            "n": -1, "big": 18446744073709551615u64, "tiny": 1e-300, "none": null,
            "stream": true, "off": false, "empty": {}, "list": [],
            "messages": [{"role": "user", "content": "line\none \"quoted\" \\ tab\t \u{1}"}],
        });
        assert_eq!(to_vec(&v), serde_json::to_vec(&v).unwrap());
        let fields: Vec<(&str, &Value)> = v
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, x)| (k.as_str(), x))
            .collect();
        assert_eq!(
            fields_to_vec(fields.iter().copied()),
            serde_json::to_vec(&v).unwrap()
        );
    }

    /// Strings dense in what JSON escapes, beside bytes the word test could confuse.
    fn escapes() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(vec![
                '"', '\\', '\n', '\t', '\u{0}', '\u{1f}', ' ', '#', ']', '\u{7f}', 'a', 'é', '😀',
            ]),
            0..40,
        )
        .prop_map(|cs| cs.into_iter().collect())
    }

    fn any_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            "[\\x00-\\x7f]{0,40}".prop_map(Value::String),
            escapes().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map(prop_oneof![any::<String>(), escapes()], inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_tree_is_written_as_serde_json_writes_it(v in any_value()) {
            prop_assert_eq!(to_vec(&v), serde_json::to_vec(&v).unwrap());
        }
    }
}
