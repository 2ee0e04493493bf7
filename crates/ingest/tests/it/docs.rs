//! `docs/ARCHITECTURE.md` stays a map a reader can follow: every file the codemap names
//! exists in its crate, and every invariant is numbered in reading order, has a stable
//! name and names tests that exist. No stack needed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn architecture() -> String {
    std::fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md")
}

/// The backticked pieces of `line`.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// Every file below `dir`, as paths relative to it.
fn files_below(dir: &Path, out: &mut Vec<String>, base: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_below(&path, out, base);
        } else if let Ok(rel) = path.strip_prefix(base) {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn every_file_the_codemap_names_exists_in_its_crate() {
    let doc = architecture();
    let table = doc
        .split("## Crates")
        .nth(1)
        .and_then(|t| t.split("\n\n").nth(1))
        .expect("the crates table");
    let mut missing = Vec::new();
    let mut named = 0;
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let spans = code_spans(row);
        // The first cell names one crate or several (`worker-inapp`, `worker-email`, …).
        let first_cell = row.split('|').nth(1).unwrap_or("");
        let crates: Vec<&str> = code_spans(first_cell);
        let mut files = Vec::new();
        for krate in &crates {
            let dir = repo().join("crates").join(krate);
            assert!(
                dir.is_dir(),
                "the codemap names crate {krate}, which does not exist"
            );
            files_below(&dir, &mut files, &dir);
        }
        for span in spans
            .iter()
            .filter(|s| s.ends_with(".rs") || s.ends_with(".html"))
        {
            named += 1;
            let found = files
                .iter()
                .any(|f| f == span || f.ends_with(&format!("/{span}")));
            if !found {
                missing.push(format!("{span} (row {})", crates.join(", ")));
            }
        }
    }
    assert!(named > 20, "the codemap names only {named} files");
    assert!(
        missing.is_empty(),
        "the codemap names files that do not exist: {missing:#?}"
    );
}

#[test]
fn every_invariant_is_numbered_in_order_named_and_shown_by_tests_that_exist() {
    let doc = architecture();
    let section = doc
        .split("## Invariants")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the invariants section");
    let mut number = 0;
    let mut names = HashSet::new();
    let mut shown = 0;
    let mut missing = Vec::new();
    let it = repo().join("crates/ingest/tests/it");
    for item in section.split('\n').filter(|l| {
        l.split_once(". `")
            .is_some_and(|(n, _)| n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty())
    }) {
        number += 1;
        let (n, rest) = item.split_once(". `").unwrap();
        assert_eq!(
            n.parse::<usize>().unwrap(),
            number,
            "invariant {n} is out of order"
        );
        let name = rest.split('`').next().unwrap();
        assert!(
            names.insert(name.to_string()),
            "two invariants are named {name}"
        );
    }
    for item in section.split("*Shown by:*").skip(1) {
        shown += 1;
        let line = item.lines().next().unwrap_or("");
        for span in code_spans(line) {
            let Some((module, test)) = span.split_once("::") else {
                continue;
            };
            let file = it.join(format!("{module}.rs"));
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            if !text.contains(&format!("fn {test}(")) {
                missing.push(span.to_string());
            }
        }
    }
    assert!(number >= 20, "only {number} invariants found");
    assert!(
        shown >= number,
        "{} invariants name no test",
        number - shown
    );
    assert!(
        missing.is_empty(),
        "invariants name tests that do not exist: {missing:#?}"
    );
}

#[test]
fn docs_data_names_every_table_the_migrations_create() {
    let data = std::fs::read_to_string(repo().join("docs/data.md")).expect("docs/data.md");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(repo().join("migrations")).expect("migrations") {
        let sql = std::fs::read_to_string(entry.expect("entry").path()).expect("a migration");
        for rest in sql.split("CREATE TABLE ").skip(1) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !data.contains(&format!("`{name}`")) {
                missing.push(name);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/data.md says nothing of {missing:?}"
    );
    assert!(data.contains("\n## Retention\n"), "the retention heading");
}
