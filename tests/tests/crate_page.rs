//! The crate's page on crates.io and docs.rs: its own README (not the
//! repository's), whose quick start is the one `readme.rs` builds and runs,
//! whose links work from crates.io (absolute), and a license file that
//! matches `license` in Cargo.toml. No control plane needed.

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
