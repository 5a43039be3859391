//! `upstream-gen FILE [FEATURE...]`: prints the Rust source FILE as it reads
//! when exactly the cargo features FEATURE... exist and are on, for
//! `scripts/upstream.sh`, which turns the crate's core into a patch series
//! for kube-runtime.
//!
//! Every `#[cfg(...)]` and `#[cfg_attr(...)]` whose predicate names a feature
//! is evaluated, `feature = "x"` being true exactly for the features given;
//! every other configuration predicate (`test`, `docsrs`, ...) is kept as it
//! is. Then:
//! - an item, field, variant, match arm, statement or struct-literal field
//!   whose `cfg` is false is removed, with its attributes, its trailing comma
//!   and the plain comments on the lines right above it;
//! - a `cfg` that is true is removed and its node kept; one that still
//!   depends on other predicates is rewritten to what is left of it;
//! - a `cfg_attr(p, a)` becomes `#[a]` when `p` is true and disappears when
//!   it is false, except `cfg_attr(p, allow(dead_code))` with `p` true: the
//!   item exists for features that are off, so it is removed.
//!
//! The text outside the removed ranges is copied byte for byte (comments and
//! formatting kept); `rustfmt` tidies the result afterwards.

#![forbid(unsafe_code)]

use std::{collections::BTreeSet, process::ExitCode};

use proc_macro2::{LineColumn, Span};
use quote::ToTokens;
use syn::{
    Attribute, Meta,
    punctuated::Punctuated,
    spanned::Spanned,
    visit::{self, Visit},
};

/// What a configuration predicate is once the features are known.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Known(bool),
    /// Depends on a predicate that is not a feature: what is left of it.
    Open(String),
}

fn eval(meta: &Meta, features: &BTreeSet<String>) -> Value {
    match meta {
        Meta::NameValue(nv) if nv.path.is_ident("feature") => {
            let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
            else {
                return Value::Open(meta.to_token_stream().to_string());
            };
            Value::Known(features.contains(&s.value()))
        }
        Meta::List(list)
            if list.path.is_ident("any") || list.path.is_ident("all") || list.path.is_ident("not") =>
        {
            let Ok(args) = list.parse_args_with(Punctuated::<Meta, syn::Token![,]>::parse_terminated) else {
                return Value::Open(meta.to_token_stream().to_string());
            };
            let values: Vec<Value> = args.iter().map(|m| eval(m, features)).collect();
            let name = list.path.get_ident().map(ToString::to_string).unwrap_or_default();
            combine(&name, values)
        }
        other => Value::Open(other.to_token_stream().to_string()),
    }
}

fn combine(name: &str, values: Vec<Value>) -> Value {
    let open: Vec<String> = values
        .iter()
        .filter_map(|v| match v {
            Value::Open(s) => Some(s.clone()),
            Value::Known(_) => None,
        })
        .collect();
    let known = |b: bool| values.contains(&Value::Known(b));
    match name {
        "not" => match values.into_iter().next() {
            Some(Value::Known(b)) => Value::Known(!b),
            Some(Value::Open(s)) => Value::Open(format!("not({s})")),
            None => Value::Known(false),
        },
        "any" if known(true) => Value::Known(true),
        "all" if known(false) => Value::Known(false),
        _ if open.is_empty() => Value::Known(name == "all"),
        _ if open.len() == 1 => Value::Open(open[0].clone()),
        _ => Value::Open(format!("{name}({})", open.join(", "))),
    }
}

/// One replacement of a byte range of the source.
struct Edit {
    start: usize,
    end: usize,
    with: String,
}

struct Gen<'a> {
    text: &'a str,
    /// The byte offset of each line's start.
    lines: Vec<usize>,
    features: &'a BTreeSet<String>,
    edits: Vec<Edit>,
}

impl Gen<'_> {
    fn offset(&self, at: LineColumn) -> usize {
        let start = self.lines[at.line - 1];
        self.text[start..]
            .char_indices()
            .nth(at.column)
            .map_or(self.text.len(), |(i, _)| start + i)
    }

    fn range(&self, span: Span) -> (usize, usize) {
        (self.offset(span.start()), self.offset(span.end()))
    }

    /// Removes `start..end`, widened to whole lines (with the plain comments
    /// right above) when nothing else stands on them, and with the comma
    /// after it.
    fn remove(&mut self, start: usize, end: usize) {
        let after = self.text[end..].trim_start_matches([' ', '\t']);
        let mut end = if after.starts_with(',') {
            self.text.len() - after.len() + 1
        } else {
            end
        };
        let mut start = start;
        if let Some((line_start, line_end)) = self.whole_lines(start, end) {
            (start, end) = (line_start, line_end);
            // The plain comments right above describe what is removed.
            while start > 0 {
                let prev_start = self.text[..start - 1].rfind('\n').map_or(0, |i| i + 1);
                let line = self.text[prev_start..start].trim();
                if line.starts_with("//") && !line.starts_with("///") && !line.starts_with("//!") {
                    start = prev_start;
                } else {
                    break;
                }
            }
        }
        self.edits.push(Edit {
            start,
            end,
            with: String::new(),
        });
    }

    /// Removes one attribute, with its line when it stands alone on it.
    fn remove_attr(&mut self, attr: &Attribute) {
        let (start, end) = self.range(attr.span());
        let (start, end) = self.whole_lines(start, end).unwrap_or((start, end));
        self.edits.push(Edit {
            start,
            end,
            with: String::new(),
        });
    }

    fn replace_attr(&mut self, attr: &Attribute, with: String) {
        let (start, end) = self.range(attr.span());
        self.edits.push(Edit { start, end, with });
    }

    /// `start..end` widened to the whole lines it stands on, with their line
    /// ends, if nothing else stands on them.
    fn whole_lines(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let line_start = self.text[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = self.text[end..]
            .find('\n')
            .map_or(self.text.len(), |i| end + i + 1);
        (self.text[line_start..start].trim().is_empty() && self.text[end..line_end].trim().is_empty())
            .then_some((line_start, line_end))
    }

    /// Decides a node by its attributes: `true` when it is removed (and its
    /// children are then not visited).
    fn decide(&mut self, attrs: &[Attribute], node: Span) -> bool {
        for attr in attrs {
            if attr.path().is_ident("cfg") {
                let Ok(meta) = attr.parse_args::<Meta>() else {
                    continue;
                };
                match eval(&meta, self.features) {
                    Value::Known(true) => self.remove_attr(attr),
                    Value::Known(false) => return self.remove_node(attrs, node),
                    Value::Open(rest) if rest != meta.to_token_stream().to_string() => {
                        self.replace_attr(attr, format!("#[cfg({rest})]"));
                    }
                    Value::Open(_) => {}
                }
            } else if attr.path().is_ident("cfg_attr") {
                let Ok(args) = attr.parse_args_with(Punctuated::<Meta, syn::Token![,]>::parse_terminated)
                else {
                    continue;
                };
                let mut args = args.into_iter();
                let Some(pred) = args.next() else { continue };
                let rest: Vec<String> = args.map(|m| m.to_token_stream().to_string()).collect();
                let rest = rest.join(", ");
                match eval(&pred, self.features) {
                    Value::Known(true) if is_dead_code_allow(&rest) => {
                        return self.remove_node(attrs, node);
                    }
                    Value::Known(true) => self.replace_attr(attr, format!("#[{rest}]")),
                    Value::Known(false) => self.remove_attr(attr),
                    Value::Open(p) if p != pred.to_token_stream().to_string() => {
                        self.replace_attr(attr, format!("#[cfg_attr({p}, {rest})]"));
                    }
                    Value::Open(_) => {}
                }
            }
        }
        false
    }

    fn remove_node(&mut self, attrs: &[Attribute], node: Span) -> bool {
        let (mut start, end) = self.range(node);
        for attr in attrs {
            start = start.min(self.range(attr.span()).0);
        }
        // Only this node's edits stand: drop those made on its attributes.
        self.edits.retain(|e| e.end <= start || e.start >= end);
        self.remove(start, end);
        true
    }
}

/// Whether `attrs` (a `cfg_attr`'s attributes) only allow dead code.
fn is_dead_code_allow(attrs: &str) -> bool {
    let attrs = attrs.replace(' ', "");
    attrs == "allow(dead_code)" || attrs.starts_with("allow(dead_code,reason=")
}

fn expr_attrs(expr: &syn::Expr) -> &[Attribute] {
    use syn::Expr;
    match expr {
        Expr::Call(e) => &e.attrs,
        Expr::MethodCall(e) => &e.attrs,
        Expr::Macro(e) => &e.attrs,
        Expr::Block(e) => &e.attrs,
        Expr::Assign(e) => &e.attrs,
        Expr::If(e) => &e.attrs,
        Expr::Match(e) => &e.attrs,
        Expr::Path(e) => &e.attrs,
        Expr::Struct(e) => &e.attrs,
        Expr::Closure(e) => &e.attrs,
        Expr::Let(e) => &e.attrs,
        Expr::Try(e) => &e.attrs,
        Expr::Await(e) => &e.attrs,
        Expr::Return(e) => &e.attrs,
        Expr::Binary(e) => &e.attrs,
        Expr::Unary(e) => &e.attrs,
        Expr::Field(e) => &e.attrs,
        Expr::Reference(e) => &e.attrs,
        Expr::Paren(e) => &e.attrs,
        Expr::Tuple(e) => &e.attrs,
        Expr::Lit(e) => &e.attrs,
        Expr::Index(e) => &e.attrs,
        Expr::Cast(e) => &e.attrs,
        Expr::Loop(e) => &e.attrs,
        Expr::While(e) => &e.attrs,
        Expr::ForLoop(e) => &e.attrs,
        Expr::Async(e) => &e.attrs,
        _ => &[],
    }
}

fn item_attrs(item: &syn::Item) -> &[Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for Gen<'_> {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        if !self.decide(item_attrs(i), i.span()) {
            visit::visit_item(self, i);
        }
    }

    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs: &[Attribute] = match i {
            syn::ImplItem::Const(x) => &x.attrs,
            syn::ImplItem::Fn(x) => &x.attrs,
            syn::ImplItem::Type(x) => &x.attrs,
            syn::ImplItem::Macro(x) => &x.attrs,
            _ => &[],
        };
        if !self.decide(attrs, i.span()) {
            visit::visit_impl_item(self, i);
        }
    }

    fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
        let attrs: &[Attribute] = match i {
            syn::TraitItem::Const(x) => &x.attrs,
            syn::TraitItem::Fn(x) => &x.attrs,
            syn::TraitItem::Type(x) => &x.attrs,
            syn::TraitItem::Macro(x) => &x.attrs,
            _ => &[],
        };
        if !self.decide(attrs, i.span()) {
            visit::visit_trait_item(self, i);
        }
    }

    fn visit_field(&mut self, f: &'ast syn::Field) {
        if !self.decide(&f.attrs, f.span()) {
            visit::visit_field(self, f);
        }
    }

    fn visit_variant(&mut self, v: &'ast syn::Variant) {
        if !self.decide(&v.attrs, v.span()) {
            visit::visit_variant(self, v);
        }
    }

    fn visit_arm(&mut self, a: &'ast syn::Arm) {
        if !self.decide(&a.attrs, a.span()) {
            visit::visit_arm(self, a);
        }
    }

    fn visit_field_value(&mut self, f: &'ast syn::FieldValue) {
        if !self.decide(&f.attrs, f.span()) {
            visit::visit_field_value(self, f);
        }
    }

    fn visit_stmt(&mut self, s: &'ast syn::Stmt) {
        let attrs: &[Attribute] = match s {
            syn::Stmt::Local(l) => &l.attrs,
            syn::Stmt::Macro(m) => &m.attrs,
            syn::Stmt::Expr(e, _) => expr_attrs(e),
            syn::Stmt::Item(_) => &[],
        };
        if !self.decide(attrs, s.span()) {
            visit::visit_stmt(self, s);
        }
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: upstream-gen FILE [FEATURE...]");
        return ExitCode::from(2);
    };
    let features: BTreeSet<String> = args.collect();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("upstream-gen: {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let file = match syn::parse_file(&text) {
        Ok(f) => f,
        Err(e) => {
            let at = e.span().start();
            eprintln!("upstream-gen: {path}:{}:{}: {e}", at.line, at.column + 1);
            return ExitCode::FAILURE;
        }
    };
    let lines = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let mut g = Gen {
        text: &text,
        lines,
        features: &features,
        edits: Vec::new(),
    };
    for item in &file.items {
        g.visit_item(item);
    }
    let mut edits = g.edits;
    edits.sort_by_key(|e| std::cmp::Reverse(e.start));
    let mut out = text.clone();
    let mut floor = usize::MAX;
    for e in edits {
        // Nested or overlapping edits: the outer one was applied.
        if e.end > floor {
            continue;
        }
        out.replace_range(e.start..e.end, &e.with);
        floor = e.start;
    }
    print!("{out}");
    ExitCode::SUCCESS
}
