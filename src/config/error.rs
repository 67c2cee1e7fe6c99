//! Why a configuration could not be loaded, said on one line that names the
//! file, the table, the field and where it is written.
//!
//! Three sources feed [`ConfigError`]: the TOML parser (syntax), serde (a
//! wrong type, an unknown field, a value no type accepts), and
//! [`validate`](super::validate) (a rule between fields). The first two carry
//! a byte span; for the third, the field is looked up in the parsed document
//! to find its line.

use std::path::PathBuf;

use super::validate::Violation;

/// Why a configuration could not be loaded. Every message names the file and,
/// where there is one, the table and field, on one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read config file: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML.
    #[error("{origin}: TOML syntax error at line {line}, column {column}: {message}")]
    Syntax {
        /// The file name.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column (in characters).
        column: usize,
        /// What the TOML parser said.
        message: String,
    },
    /// A table holds a field this version does not know (often a typo).
    #[error("{origin}: [{table}] {message}{}", at(.location))]
    UnknownField {
        /// The file name.
        origin: String,
        /// The table, as written in a header: `defaults`, `keys."north"`, `top level`.
        table: String,
        /// The unknown field.
        field: String,
        /// What the deserializer said, including the fields it expected.
        message: String,
        /// 1-based line and column, when known.
        location: Option<(usize, usize)>,
    },
    /// A value has the wrong type or cannot be parsed.
    #[error("{origin}: [{table}] {}{message}{}", field_prefix(.field), at(.location))]
    Value {
        /// The file name.
        origin: String,
        /// The table, as written in a header: `defaults`, `keys."north"`, `top level`.
        table: String,
        /// The field, if the error is within one.
        field: Option<String>,
        /// What is wrong.
        message: String,
        /// 1-based line and column, when known.
        location: Option<(usize, usize)>,
    },
    /// The file parsed, but a value is out of range or inconsistent.
    #[error("{origin}: [{table}] {field}: {message}{}", at(.location))]
    Invalid {
        /// The file name.
        origin: String,
        /// The table, as written in a header: `defaults`, `keys."north"`, `top level`.
        table: String,
        /// The field.
        field: String,
        /// What is wrong, and what is allowed.
        message: String,
        /// 1-based line and column of the field's key; of its table's when
        /// the field is not written (it took its default); `None` when
        /// neither is.
        location: Option<(usize, usize)>,
    },
}

impl ConfigError {
    /// A TOML syntax error in `text`.
    pub(super) fn syntax(origin: &str, text: &str, err: &toml::de::Error) -> ConfigError {
        let (line, column) = err.span().map_or((1, 1), |s| line_column(text, s.start));
        ConfigError::Syntax {
            origin: origin.to_owned(),
            line,
            column,
            message: one_line(err.message()),
        }
    }

    /// A serde error while deserializing `text`, at the path it names.
    pub(super) fn value(
        origin: &str,
        text: &str,
        err: &serde_path_to_error::Error<toml::de::Error>,
    ) -> ConfigError {
        let segments: Vec<String> = err
            .path()
            .iter()
            .map(|segment| match segment {
                serde_path_to_error::Segment::Map { key } => key.clone(),
                serde_path_to_error::Segment::Seq { index } => index.to_string(),
                serde_path_to_error::Segment::Enum { variant } => variant.clone(),
                serde_path_to_error::Segment::Unknown => "?".to_owned(),
            })
            .collect();
        let (table, field) = table_and_field(&segments);
        let inner = err.inner();
        let location = inner.span().map(|s| line_column(text, s.start));
        let message = one_line(inner.message());
        let origin = origin.to_owned();
        match field {
            Some(field) if message.starts_with("unknown field") => ConfigError::UnknownField {
                origin,
                table,
                field,
                message,
                location,
            },
            field => ConfigError::Value {
                origin,
                table,
                field,
                message,
                location,
            },
        }
    }

    /// A rule `validate` found broken in the configuration parsed from `text`.
    pub(super) fn invalid(origin: &str, text: &str, violation: Violation) -> ConfigError {
        let (table, field) = table_and_field(&violation.path);
        ConfigError::Invalid {
            origin: origin.to_owned(),
            table,
            field: field.unwrap_or_default(),
            message: violation.message,
            location: locate(text, &violation.path),
        }
    }
}

fn at(location: &Option<(usize, usize)>) -> String {
    match location {
        Some((line, column)) => format!(" (line {line}, column {column})"),
        None => String::new(),
    }
}

fn field_prefix(field: &Option<String>) -> String {
    match field {
        Some(field) => format!("{field}: "),
        None => String::new(),
    }
}

/// The name the messages use for the top-level table.
const TOP_LEVEL: &str = "top level";

/// Joins a possibly multi-line message into one line.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// Where the key at `path` (table names, then the field) is written in
/// `text`: the deepest of its segments found, so a field left at its default
/// points at its table's header.
fn locate(text: &str, path: &[String]) -> Option<(usize, usize)> {
    let document = toml::de::DeTable::parse(text).ok()?;
    let mut table = document.get_ref();
    let mut found = None;
    for segment in path {
        let Some((key, value)) = table.get_key_value(segment.as_str()) else {
            break;
        };
        found = Some(key.span().start);
        match value.get_ref().as_table() {
            Some(inner) => table = inner,
            None => break,
        }
    }
    found.map(|offset| line_column(text, offset))
}

/// Whether a TOML key can be written bare.
fn is_bare_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A key as TOML would write it, quoted if needed (or if `force_quote`).
fn toml_key(key: &str, force_quote: bool) -> String {
    if !force_quote && is_bare_key(key) {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// Splits a path of keys into the table (as in a header) and the field.
///
/// The patterns of `[keys."..."]` are always quoted, as they are in the
/// documentation, so that a glob's '*' reads as part of a string.
fn table_and_field(path: &[String]) -> (String, Option<String>) {
    let Some((field, tables)) = path.split_last() else {
        return (TOP_LEVEL.to_owned(), None);
    };
    if tables.is_empty() {
        return (TOP_LEVEL.to_owned(), Some(field.clone()));
    }
    let in_keys = tables[0] == "keys";
    let table = tables
        .iter()
        .enumerate()
        .map(|(i, part)| toml_key(part, i == 1 && in_keys))
        .collect::<Vec<_>>()
        .join(".");
    let field_is_pattern = tables.len() == 1 && in_keys;
    (table, Some(toml_key(field, field_is_pattern)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(segments: &[&str]) -> Vec<String> {
        segments.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Lines and columns are 1-based and count characters, not bytes.
    #[test]
    fn line_column_counts_characters() {
        let text = "a = 1\né = \"x\"\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 4), (1, 5));
        assert_eq!(line_column(text, 6), (2, 1));
        // Byte 9 is the "=", past "é" (2 bytes) and " ".
        assert_eq!(line_column(text, 9), (2, 3));
        assert_eq!(line_column(text, 999), (3, 1));
    }

    /// A key is found in headers, dotted keys and inline tables; a key that
    /// is not written falls back to its table, and to nothing at all.
    #[test]
    fn locate_finds_the_key() {
        let text = "listen = \"x\"\ndedup.window = \"0s\"\n\
                    sweeper = { batch = 1, max_sleep = \"0s\" }\n\
                    [redis]\nshards = 0\n\n[keys.\"a*\"]\nmax_items = 3\n";
        let at = |segments: &[&str]| locate(text, &path(segments));
        assert_eq!(at(&["listen"]), Some((1, 1)));
        assert_eq!(at(&["dedup", "window"]), Some((2, 7)));
        assert_eq!(at(&["sweeper", "max_sleep"]), Some((3, 24)));
        assert_eq!(at(&["redis", "shards"]), Some((5, 1)));
        assert_eq!(at(&["keys", "a*"]), Some((7, 7)));
        assert_eq!(at(&["keys", "a*", "max_items"]), Some((8, 1)));
        assert_eq!(at(&["keys", "a*", "max_wait"]), Some((7, 7)));
        assert_eq!(at(&["defaults", "max_items"]), None);
        assert_eq!(locate("not = = toml", &path(&["not"])), None);
    }

    /// Tables are named as in a header, with key patterns always quoted.
    #[test]
    fn tables_are_named_as_in_headers() {
        assert_eq!(table_and_field(&[]), ("top level".to_owned(), None));
        assert_eq!(
            table_and_field(&path(&["listen"])),
            ("top level".to_owned(), Some("listen".to_owned()))
        );
        assert_eq!(
            table_and_field(&path(&["keys", "north", "max_items"])),
            ("keys.\"north\"".to_owned(), Some("max_items".to_owned()))
        );
        assert_eq!(
            table_and_field(&path(&["keys", "a*"])),
            ("keys".to_owned(), Some("\"a*\"".to_owned()))
        );
        assert_eq!(
            table_and_field(&path(&["redis", "a b"])),
            ("redis".to_owned(), Some("\"a b\"".to_owned()))
        );
    }
}
