//! The crate's page on crates.io and docs.rs: its own README (not the
//! repository's), whose quick start is the one `readme.rs` builds and runs,
//! whose links work from crates.io (absolute), and a license file that
//! matches `license` in Cargo.toml; and the repository README's
//! *Troubleshooting*, whose quoted log lines the library writes. No control
//! plane needed.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, ensure};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(root().join(path)).with_context(|| format!("reading {path}"))
}

/// The fenced block right after the `<!-- quickstart:{name}` marker.
fn quickstart_block<'a>(readme: &'a str, name: &str) -> Result<&'a str> {
    let marker = format!("<!-- quickstart:{name}");
    let at = readme.find(&marker).with_context(|| format!("no {marker}"))?;
    let open = at + readme[at..].find("```").context("no block after the marker")?;
    let close = open + 3 + readme[open + 3..].find("```").context("unclosed block")?;
    Ok(&readme[open..close + 3])
}

#[test]
fn the_crate_readme_is_its_own_and_its_quick_start_is_the_tested_one() -> Result<()> {
    let manifest = read("kube-runtime-lease/Cargo.toml")?;
    ensure!(
        manifest.contains("readme = \"README.md\""),
        "the crate's page must be kube-runtime-lease/README.md"
    );
    let page = read("kube-runtime-lease/README.md")?;
    let repository = read("README.md")?;
    for block in ["Cargo.toml", "main.rs"] {
        ensure!(
            quickstart_block(&page, block)? == quickstart_block(&repository, block)?,
            "the crate README's {block} differs from the README's, which tests/tests/readme.rs builds and runs"
        );
    }
    Ok(())
}

#[test]
fn the_crate_readme_links_work_from_crates_io() -> Result<()> {
    let page = read("kube-runtime-lease/README.md")?;
    let mut links = 0;
    for (at, _) in page.match_indices("](") {
        let target = &page[at + 2..at + 2 + page[at + 2..].find(')').context("unclosed link")?];
        ensure!(
            target.starts_with("https://"),
            "a relative link does not work on crates.io: {target}"
        );
        links += 1;
    }
    ensure!(links >= 2, "the page links to its docs ({links} links)");
    ensure!(
        !page.contains("Go 1.26") && !page.contains("scripts/"),
        "the repository's matters stay out"
    );
    Ok(())
}

#[test]
fn the_license_file_matches_the_manifest() -> Result<()> {
    let workspace = read("Cargo.toml")?;
    ensure!(
        workspace.contains("license = \"Apache-2.0\""),
        "license in Cargo.toml"
    );
    for path in ["LICENSE", "kube-runtime-lease/LICENSE"] {
        let text = read(path)?;
        ensure!(
            text.contains("Apache License") && text.contains("Version 2.0, January 2004"),
            "{path} is not the Apache License 2.0"
        );
    }
    Ok(())
}

/// The crate's library source, without its tests and test kit, with Rust's
/// string continuations (`\` at the end of a line) joined, as the log lines
/// are written.
fn library_source() -> Result<String> {
    fn walk(dir: &Path, out: &mut String) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if path.is_dir() {
                if name != "tests" && name != "test_util" {
                    walk(&path, out)?;
                }
            } else if path.extension().is_some_and(|e| e == "rs") && name != "tests.rs" {
                out.push_str(&std::fs::read_to_string(&path)?);
            }
        }
        Ok(())
    }
    let mut source = String::new();
    walk(&root().join("kube-runtime-lease/src"), &mut source)?;
    let mut joined = String::with_capacity(source.len());
    let mut lines = source.split('\n');
    while let Some(line) = lines.next() {
        joined.push_str(line);
        let mut continued = line.ends_with('\\');
        while continued {
            joined.pop();
            let Some(next) = lines.next() else { break };
            joined.push_str(next.trim_start());
            continued = next.ends_with('\\');
        }
        joined.push('\n');
    }
    Ok(joined)
}

/// The README's *Troubleshooting* quotes the crate's log lines as the code
/// writes them: each quote of a line (not a command, a status or
/// client-go's line) is in the library's source, `...` standing for what
/// the line fills in; the few whose quoted words are filled in from values
/// are checked as the code writes them.
#[test]
fn the_troubleshooting_section_quotes_the_log_lines_the_crate_writes() -> Result<()> {
    const TEMPLATED: &[(&str, &[&str])] = &[
        (
            "forbidden to get lease ns/name: RBAC needs ...",
            &["forbidden to {verb} lease {namespace}/{name}: RBAC needs verbs"],
        ),
        (
            "acquiring the lease failed",
            &["\"acquiring the lease\"", "\"{what} failed\""],
        ),
        (
            "renewing the lease failed",
            &["\"renewing the lease\"", "\"{what} failed\""],
        ),
        (
            "lease get request timed out after ...",
            &["lease {verb} request timed out after"],
        ),
        (
            "forbidden to publish the LeaseCandidate: RBAC needs ...",
            &[
                "forbidden to publish the LeaseCandidate: {RBAC_RULE}",
                "= \"RBAC needs",
            ],
        ),
    ];
    const NOT_LINES: &[&str] = &["kubectl ", "helm ", "aws ", "410 "];
    let readme = read("README.md")?;
    let start = readme
        .find("## Troubleshooting")
        .context("no Troubleshooting section")?;
    let end = readme[start + 3..]
        .find("\n## ")
        .map_or(readme.len(), |e| start + 3 + e);
    let section = readme[start..end]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let source = library_source()?;
    let (mut missing, mut checked) = (Vec::new(), 0);
    let mut rest = section.as_str();
    while let Some(open) = rest.find('`') {
        let (before, after) = (&rest[..open], &rest[open + 1..]);
        let Some(close) = after.find('`') else { break };
        let quote = &after[..close];
        rest = &after[close + 1..];
        if !quote.contains(' ')
            || before.ends_with("client-go: ")
            || NOT_LINES.iter().any(|p| quote.starts_with(p))
        {
            continue;
        }
        checked += 1;
        let fragments: Vec<&str> = match TEMPLATED.iter().find(|(q, _)| *q == quote) {
            Some((_, code)) => code.to_vec(),
            None => quote
                .split("...")
                .flat_map(|f| f.split('…'))
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .collect(),
        };
        missing.extend(
            fragments
                .into_iter()
                .filter(|f| !source.contains(f))
                .map(|f| format!("`{quote}`: {f:?}")),
        );
    }
    ensure!(checked >= 20, "only {checked} quotes of log lines found");
    ensure!(
        missing.is_empty(),
        "quoted in the README's Troubleshooting but written by no line of the library:\n{}",
        missing.join("\n")
    );
    Ok(())
}
