//! Aligned text tables for people (scripts use `--json`).

/// A table: a header row and rows of cells, left-aligned in columns two spaces apart.
#[derive(Debug)]
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub(crate) fn new(headers: &[&str]) -> Self {
        Self {
            rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    /// Appends a row (missing cells are blank, extra ones are kept).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Whether only the header is there.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.len() <= 1
    }

    /// The text, one line per row; the last column is not padded, so no line ends in
    /// spaces.
    pub(crate) fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i] - cell.chars().count();
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `-` for a missing value, so that columns stay aligned and readable.
pub(crate) fn or_dash(value: Option<&str>) -> String {
    match value {
        Some(v) if !v.is_empty() => v.to_owned(),
        Some(_) | None => "-".to_owned(),
    }
}

/// Whether the items name more than one provider (then tables get a PROVIDER column).
pub(crate) fn several<'a>(providers: impl Iterator<Item = &'a str>) -> bool {
    let mut all: Vec<_> = providers.collect();
    all.sort_unstable();
    all.dedup();
    all.len() > 1
}

/// A table with a leading PROVIDER column when `with_provider`.
pub(crate) fn table(with_provider: bool, headers: &[&str]) -> Table {
    let mut all = Vec::with_capacity(headers.len() + 1);
    if with_provider {
        all.push("PROVIDER");
    }
    all.extend_from_slice(headers);
    Table::new(&all)
}

/// `cells`, after the provider when `with_provider`.
pub(crate) fn cells(with_provider: bool, provider: &str, mut cells: Vec<String>) -> Vec<String> {
    if with_provider {
        cells.insert(0, provider.to_owned());
    }
    cells
}

/// The table, or `none` when it has no rows.
pub(crate) fn rendered(table: &Table, none: &str) -> String {
    if table.is_empty() {
        format!("{none}\n")
    } else {
        table.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_the_widest_cell() {
        let mut t = Table::new(&["ID", "STATE", "PATH"]);
        assert!(t.is_empty());
        t.row(vec!["a".into(), "PUBLISHED".into(), "/x".into()]);
        t.row(vec!["long-id".into(), "CREATED".into(), String::new()]);
        assert!(!t.is_empty());
        assert_eq!(
            t.render(),
            "ID       STATE      PATH\n\
             a        PUBLISHED  /x\n\
             long-id  CREATED\n"
        );
        assert_eq!(or_dash(None), "-");
        assert_eq!(or_dash(Some("")), "-");
        assert_eq!(or_dash(Some("x")), "x");
    }
}
