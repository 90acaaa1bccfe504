//! [`EscapedFields`]: the text format's field formatter, which escapes every control
//! character of every field value (the message included).
//!
//! Field values come from outside as often as not: a CSI plugin's volume ids, contexts
//! and error messages, an agent's answers, file names. In the text format one event is
//! one line, so a value with a newline forges a log line, and a NUL or an escape sequence
//! makes the file binary or rewrites a terminal. `tracing-subscriber`'s default
//! formatter escapes only ANSI sequences, and only in the message; values given with `%`
//! (Display) go out as they are. This formatter writes what the default one writes
//! (`message name=value …`), with every control character (C0, DEL, C1) written as a
//! Rust escape (`\n`, `\0`, `\u{1b}`). The JSON format needs none of this: its encoder
//! escapes strings.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::Writer;

/// Formats event and span fields as the default formatter does, with control
/// characters escaped; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapedFields;

impl<'a> MakeVisitor<Writer<'a>> for EscapedFields {
    type Visitor = EscapedVisitor<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> Self::Visitor {
        EscapedVisitor {
            ansi: target.has_ansi_escapes(),
            writer: target,
            first: true,
            result: Ok(()),
        }
    }
}

/// The visitor of [`EscapedFields`].
#[derive(Debug)]
pub struct EscapedVisitor<'a> {
    writer: Writer<'a>,
    ansi: bool,
    first: bool,
    result: fmt::Result,
}

/// Writes through to `inner`, control characters escaped.
struct Escaping<'w, W: fmt::Write + ?Sized>(&'w mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(at) = rest.find(char::is_control) {
            self.0.write_str(&rest[..at])?;
            let Some(c) = rest[at..].chars().next() else {
                break;
            };
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                '\0' => self.0.write_str("\\0")?,
                other => write!(self.0, "\\u{{{:x}}}", u32::from(other))?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// `s` with its control characters escaped as the text format writes them.
pub fn escape_control(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    // Writing to a String cannot fail.
    let _ = Escaping(&mut out).write_str(s);
    out
}

impl EscapedVisitor<'_> {
    fn field(&mut self, name: &str, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        // The `log` crate's metadata, handled by the formatter already.
        if name.starts_with("log.") {
            return;
        }
        let first = std::mem::replace(&mut self.first, false);
        self.result = write_field(&mut self.writer, self.ansi, first, name, value);
    }
}

fn write_field(
    w: &mut Writer<'_>,
    ansi: bool,
    first: bool,
    name: &str,
    value: &dyn fmt::Debug,
) -> fmt::Result {
    if !first {
        w.write_char(' ')?;
    }
    if name != "message" {
        let name = name.strip_prefix("r#").unwrap_or(name);
        if ansi {
            write!(w, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m")?;
        } else {
            write!(w, "{name}=")?;
        }
    }
    write!(Escaping(w), "{value:?}")
}

impl Visit for EscapedVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.field(field.name(), &format_args!("{value}"));
        } else {
            self.field(field.name(), &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let chain = slrp_chain(value);
        self.field(field.name(), &format_args!("{chain}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field.name(), value);
    }
}

/// An error and its sources, `: `-joined (what `slrp_types::DisplayChain` prints; this
/// crate sits below it).
fn slrp_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

impl VisitOutput<fmt::Result> for EscapedVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for EscapedVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_nothing_else() {
        let table = [
            ("plain text, ünïcode", "plain text, ünïcode"),
            ("a\nb", "a\\nb"),
            ("a\r\nb", "a\\r\\nb"),
            ("nul\0", "nul\\0"),
            ("tab\t", "tab\\t"),
            ("\x1b[31mred", "\\u{1b}[31mred"),
            ("del\x7f", "del\\u{7f}"),
            ("c1\u{85}", "c1\\u{85}"),
            ("back\\slash", "back\\slash"),
        ];
        for (raw, want) in table {
            assert_eq!(escape_control(raw), want, "{raw:?}");
        }
    }
}
