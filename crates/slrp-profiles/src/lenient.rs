//! The JSON dialect Mesos reads profile documents in, normalised to strict JSON.
//!
//! Mesos parses a fetched profile document with protobuf's `JsonStringToMessage`, whose
//! tokenizer (`util/internal/json_stream_parser.cc`, protobuf 3.5.0 as bundled by Mesos)
//! accepts more than RFC 8259. An operator's existing file must load here unchanged, so
//! [`normalize`] rewrites exactly that dialect into strict JSON for `serde_json`, keeping a
//! map from every output byte to the input byte it came from, so syntax errors still name
//! the line and column of the operator's file.
//!
//! Accepted beyond strict JSON (each as protobuf does):
//! - single-quoted strings, for keys and values (`'fast'`; the closing quote must match);
//! - unquoted keys: `[A-Za-z_$][A-Za-z0-9_$]*` (but not one starting with `true`,
//!   `false` or `null`, which protobuf's tokenizer reads as a literal and then rejects);
//! - one trailing comma after the last member of an object or element of an array
//!   (`{"a": 1,}`, `[1, 2,]`), but not an empty member (`{,}`, `[,]`, `[1,,]`);
//! - any escaped character stands for itself (`\'`, `\q`), plus `\v` (vertical tab);
//! - raw control characters inside strings (a literal tab or newline);
//! - vertical tab and form feed as whitespace;
//! - numbers with an empty fraction (`1.`, `1.e3`), an empty integer part after a minus
//!   (`-.5`), or leading zeros in a number with a fraction or exponent (`00.5`) — all of
//!   which `strtod` takes.
//!
//! Rejected, as protobuf rejects them: comments (`//`, `/* */`), hex, octal and leading-zero
//! integers (`0x10`, `017`), a leading `+`, `NaN`/`Infinity` literals, bare words as
//! values, more than one top-level value. These are left in the output as they are, so
//! `serde_json` reports them at their position.

/// Strict JSON text and, for each of its bytes, the input byte it was made from.
#[derive(Debug)]
pub(crate) struct Normalized {
    /// The strict JSON text.
    pub(crate) text: String,
    /// `origin[i]` is the input byte offset output byte `i` came from.
    origin: Vec<usize>,
}

impl Normalized {
    /// The input (line, column) of an output (line, column) as `serde_json` reports them
    /// (1-based; columns count bytes).
    pub(crate) fn input_position(&self, input: &str, line: usize, column: usize) -> (usize, usize) {
        let out_start = line_start(&self.text, line);
        let out = (out_start + column.saturating_sub(1)).min(self.origin.len().saturating_sub(1));
        let Some(&at) = self.origin.get(out) else {
            return (line, column);
        };
        let before = &input.as_bytes()[..at.min(input.len())];
        let in_line = before.iter().filter(|b| **b == b'\n').count() + 1;
        let in_start = before
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |p| p + 1);
        (in_line, at - in_start + 1)
    }
}

/// Byte offset where 1-based `line` starts in `text` (the end if there is no such line).
fn line_start(text: &str, line: usize) -> usize {
    if line <= 1 {
        return 0;
    }
    text.match_indices('\n')
        .nth(line - 2)
        .map_or(text.len(), |(i, _)| i + 1)
}

/// Protobuf's `ascii_isspace`: JSON's four plus vertical tab and form feed.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\u{0b}' | '\u{0c}')
}

fn is_key_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == '$'
}

fn is_key_char(c: char) -> bool {
    is_key_start(c) || c.is_ascii_digit()
}

/// What encloses the current position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

struct Writer {
    text: String,
    origin: Vec<usize>,
}

impl Writer {
    fn push(&mut self, s: &str, from: usize) {
        self.text.push_str(s);
        self.origin.extend(std::iter::repeat_n(from, s.len()));
    }

    fn push_char(&mut self, c: char, from: usize) {
        let mut buf = [0; 4];
        self.push(c.encode_utf8(&mut buf), from);
    }

    /// `c` as it must appear inside a strict JSON string.
    fn push_string_char(&mut self, c: char, from: usize) {
        match c {
            '"' => self.push("\\\"", from),
            '\\' => self.push("\\\\", from),
            c if u32::from(c) < 0x20 => self.push(&format!("\\u{:04x}", u32::from(c)), from),
            c => self.push_char(c, from),
        }
    }
}

/// Rewrites protobuf's JSON dialect (see the module docs) into strict JSON.
pub(crate) fn normalize(input: &str) -> Normalized {
    let mut w = Writer {
        text: String::with_capacity(input.len() + 16),
        origin: Vec::with_capacity(input.len() + 16),
    };
    let mut stack: Vec<Container> = Vec::new();
    // The last significant character written outside strings: decides whether a bare
    // word is a key and whether a comma is a trailing one.
    let mut last = None::<char>;
    let chars: Vec<(usize, char)> = input.char_indices().collect();
    let mut i = 0;
    while let Some(&(at, c)) = chars.get(i) {
        match c {
            '"' | '\'' => {
                i = string(&chars, i, &mut w);
                last = Some('"');
                continue;
            }
            c if is_space(c) => {
                // Vertical tab and form feed become spaces; the rest stay (line numbers).
                w.push_char(
                    if matches!(c, '\u{0b}' | '\u{0c}') {
                        ' '
                    } else {
                        c
                    },
                    at,
                );
            }
            '{' | '[' => {
                stack.push(if c == '{' {
                    Container::Object
                } else {
                    Container::Array
                });
                w.push_char(c, at);
                last = Some(c);
            }
            '}' | ']' => {
                stack.pop();
                w.push_char(c, at);
                last = Some(c);
            }
            ',' => {
                let after_value = !matches!(last, Some('{' | '[' | ',') | None);
                let next = chars[i + 1..]
                    .iter()
                    .map(|(_, c)| *c)
                    .find(|c| !is_space(*c));
                if after_value && matches!(next, Some('}' | ']')) {
                    // A trailing comma: a space keeps the columns of what follows.
                    w.push(" ", at);
                    last = Some(' ');
                } else {
                    w.push(",", at);
                    last = Some(',');
                }
            }
            c if c == '-' || c.is_ascii_digit() => {
                i = number(&chars, i, &mut w);
                last = Some('0');
                continue;
            }
            c if is_key_start(c)
                && stack.last() == Some(&Container::Object)
                && matches!(last, Some('{' | ',')) =>
            {
                let end = chars[i..]
                    .iter()
                    .position(|(_, c)| !is_key_char(*c))
                    .map_or(chars.len(), |n| i + n);
                let word: String = chars[i..end].iter().map(|(_, c)| *c).collect();
                if ["true", "false", "null"]
                    .iter()
                    .any(|l| word.starts_with(l))
                {
                    // Protobuf takes these for literals and fails: leave them unquoted so
                    // the strict parser fails here too.
                    w.push(&word, at);
                } else {
                    w.push("\"", at);
                    for &(a, c) in &chars[i..end] {
                        w.push_char(c, a);
                    }
                    w.push("\"", chars.get(end - 1).map_or(at, |(a, _)| *a));
                }
                i = end;
                last = Some('"');
                continue;
            }
            c => {
                w.push_char(c, at);
                last = Some(c);
            }
        }
        i += 1;
    }
    Normalized {
        text: w.text,
        origin: w.origin,
    }
}

/// Copies the string starting at `chars[start]` (its opening quote) as a strict JSON
/// string; returns the index after its closing quote (or the end, unterminated).
fn string(chars: &[(usize, char)], start: usize, w: &mut Writer) -> usize {
    let (open_at, open) = chars[start];
    w.push("\"", open_at);
    let mut i = start + 1;
    while let Some(&(at, c)) = chars.get(i) {
        if c == open {
            w.push("\"", at);
            return i + 1;
        }
        if c != '\\' {
            w.push_string_char(c, at);
            i += 1;
            continue;
        }
        let Some(&(_, e)) = chars.get(i + 1) else {
            // A lone backslash at the end: left for the strict parser to reject.
            w.push("\\", at);
            return i + 1;
        };
        match e {
            // Escapes strict JSON has; `\u` is checked (surrogates too) by the strict parser.
            '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' | 'u' => {
                w.push("\\", at);
                w.push_char(e, at);
            }
            'v' => w.push("\\u000b", at),
            // Protobuf: any other escaped character stands for itself.
            other => w.push_string_char(other, at),
        }
        i += 2;
    }
    i
}

/// Copies the number starting at `chars[start]`, completing the forms `strtod` takes but
/// strict JSON does not; returns the index after it.
fn number(chars: &[(usize, char)], start: usize, w: &mut Writer) -> usize {
    // Protobuf's number token: digits and `.eE+-x`.
    let end = chars[start..]
        .iter()
        .position(|(_, c)| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-' | 'x')))
        .map_or(chars.len(), |n| start + n);
    let token: String = chars[start..end].iter().map(|(_, c)| *c).collect();
    let at = chars[start].0;
    let floating = token.contains(['.', 'e', 'E']);
    let fixed = if floating {
        complete_float(&token)
    } else {
        None
    };
    match fixed {
        Some(text) => w.push(&text, at),
        None => {
            for &(a, c) in &chars[start..end] {
                w.push_char(c, a);
            }
        }
    }
    end
}

/// The strict spelling of a `strtod` float that strict JSON refuses (`1.`, `-.5`, `00.5`,
/// `1.e3`); `None` when the token is already strict or is not a number at all.
fn complete_float(token: &str) -> Option<String> {
    let (sign, body) = token.strip_prefix('-').map_or(("", token), |b| ("-", b));
    let int_end = body
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(body.len());
    let (int, rest) = body.split_at(int_end);
    let (fraction, exponent) = match rest.strip_prefix('.') {
        Some(r) => {
            let f_end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            (Some(&r[..f_end]), &r[f_end..])
        }
        None => (None, rest),
    };
    let exp_ok = exponent.is_empty() || {
        let e = exponent.strip_prefix(['e', 'E']).unwrap_or("!");
        let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
        !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
    };
    let has_digits = !int.is_empty() || fraction.is_some_and(|f| !f.is_empty());
    if !exp_ok || !has_digits {
        return None;
    }
    let int_norm = match int.trim_start_matches('0') {
        "" => "0",
        s => s,
    };
    let strict_int = int == int_norm;
    let strict_fraction = fraction.is_none_or(|f| !f.is_empty());
    if strict_int && strict_fraction {
        return None;
    }
    let fraction = match fraction {
        Some("") => ".0".to_owned(),
        Some(f) => format!(".{f}"),
        None => String::new(),
    };
    Some(format!("{sign}{int_norm}{fraction}{exponent}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict(input: &str) -> String {
        normalize(input).text
    }

    #[test]
    fn strict_json_passes_unchanged() {
        for doc in [
            r#"{"a": [1, 2.5, -3e4, "x\"y\\z\u00e9\n"], "b": {"c": null, "d": true}}"#,
            "[]",
            "{}",
            "  \n\t{ }\r\n",
        ] {
            assert_eq!(strict(doc), doc);
        }
    }

    #[test]
    fn each_protobuf_extension_becomes_strict_json() {
        let table = [
            ("{'a': 'b'}", r#"{"a": "b"}"#),
            (r#"{'q': 'a "b"'}"#, r#"{"q": "a \"b\""}"#),
            (r#"{"e": "\'\q\v"}"#, r#"{"e": "'q\u000b"}"#),
            ("{\"t\": \"a\tb\"}", r#"{"t": "a\u0009b"}"#),
            ("{a_b$1: 1, c: {d: 2}}", r#"{"a_b$1": 1, "c": {"d": 2}}"#),
            ("{\"a\": 1,}", "{\"a\": 1 }"),
            ("[1, 2,\n]", "[1, 2 \n]"),
            ("{\u{0b}\"a\":\u{0c}1}", "{ \"a\": 1}"),
            (
                "[1., -.5, 00.5, 1.e3, -0.0]",
                "[1.0, -0.5, 0.5, 1.0e3, -0.0]",
            ),
        ];
        for (input, want) in table {
            let got = strict(input);
            assert_eq!(got, want, "{input:?}");
            serde_json::from_str::<serde_json::Value>(&got).unwrap();
        }
    }

    #[test]
    fn what_protobuf_rejects_stays_invalid() {
        for doc in [
            "{\"a\": 1} // note",
            "/* c */ {}",
            "{,}",
            "[,]",
            "[1,,]",
            "{\"a\": 1,,}",
            "{nullable: 1}",
            "{trueish: 1}",
            "[0x10]",
            "[017]",
            "[+1]",
            "[NaN]",
            "[Infinity]",
            "{\"a\": bare}",
            "{} {}",
            "{'a\": 1}",
            "[1.5.5]",
        ] {
            let out = strict(doc);
            assert!(
                serde_json::from_str::<serde_json::Value>(&out).is_err(),
                "{doc:?} became valid: {out:?}"
            );
        }
    }

    #[test]
    fn error_positions_map_back_to_the_input() {
        // Line 3 has a single-quoted key with an escape and an unquoted key before the
        // error, so output and input columns differ there.
        let doc = "{\n  'k\\'ey': 1,\n  u: 2, 'v': ?\n}";
        let n = normalize(doc);
        let e = serde_json::from_str::<serde_json::Value>(&n.text).unwrap_err();
        let (line, column) = n.input_position(doc, e.line(), e.column());
        assert_eq!(line, 3);
        let third = doc.lines().nth(2).unwrap();
        assert_eq!(
            &third[column - 1..column],
            "?",
            "column {column} of {third:?}"
        );
        // Where nothing was rewritten the positions are serde_json's own.
        let plain = "{\n  \"a\": ?\n}";
        let n = normalize(plain);
        let e = serde_json::from_str::<serde_json::Value>(&n.text).unwrap_err();
        assert_eq!(
            n.input_position(plain, e.line(), e.column()),
            (e.line(), e.column())
        );
    }
}
