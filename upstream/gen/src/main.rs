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
//! With `--strip NAME` (repeated), the crate-only seams named are removed
//! too: code that only the crate's extras use, and that would be dead code
//! where every extra is off (scripts/upstream.py lists them: the observer
//! seam). For each NAME:
//! - the module `mod NAME`, and every item, associated function, trait item,
//!   struct field and struct-literal field named NAME, with its attributes,
//!   docs and the plain comments right above;
//! - an `impl` of a trait or for a type named NAME, and an `impl` block all
//!   of whose items are stripped;
//! - `use` leaves named NAME and `use` paths through a module named NAME (a
//!   `use` left with nothing is removed);
//! - every statement `f(...);` or `x.f(...);` that calls a function or
//!   method named NAME (its value is dropped anyway), and every `if` without
//!   `else` that holds nothing but such statements (its condition is then
//!   evaluated for nothing: the seam's conditions only read), and every
//!   `if let` without `else` whose scrutinee reads the seam (`if let Some(v)
//!   = NAME::hook() { return v; }`: what it does is the seam's).
//!
//! Each NAME stripped in FILE is printed on stderr as `upstream-gen:
//! stripped NAME`, so that the caller can fail when a NAME is stripped
//! nowhere (renamed in the crate); whatever else is left naming a stripped
//! item fails the compile of the result.
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
    /// The names of the crate-only seams to strip (`--strip`).
    strip: &'a BTreeSet<String>,
    /// The names of `strip` found, and stripped, in this file.
    stripped: BTreeSet<String>,
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

    /// Whether `ident` names a seam to strip; if so, it counts as found.
    fn strips(&mut self, ident: &syn::Ident) -> bool {
        let name = ident.to_string();
        let hit = self.strip.contains(&name);
        if hit {
            self.stripped.insert(name);
        }
        hit
    }

    /// Whether the item is a seam to strip (see the module's docs).
    fn strips_item(&mut self, item: &syn::Item) -> bool {
        use syn::Item;
        let ident = match item {
            Item::Const(i) => &i.ident,
            Item::Enum(i) => &i.ident,
            Item::Fn(i) => &i.sig.ident,
            Item::Mod(i) => &i.ident,
            Item::Static(i) => &i.ident,
            Item::Struct(i) => &i.ident,
            Item::Trait(i) => &i.ident,
            Item::TraitAlias(i) => &i.ident,
            Item::Type(i) => &i.ident,
            Item::Union(i) => &i.ident,
            Item::Impl(i) => return self.strips_impl(i),
            _ => return false,
        };
        self.strips(ident)
    }

    /// An `impl` of a stripped trait or for a stripped type, or one whose
    /// items are all stripped.
    fn strips_impl(&mut self, i: &syn::ItemImpl) -> bool {
        let trait_name = i.trait_.as_ref().and_then(|(_, path, _)| path.segments.last());
        if let Some(last) = trait_name
            && self.strips(&last.ident)
        {
            return true;
        }
        if let syn::Type::Path(ty) = &*i.self_ty
            && let Some(last) = ty.path.segments.last()
            && self.strips(&last.ident)
        {
            return true;
        }
        let names: Vec<&syn::Ident> = i
            .items
            .iter()
            .filter_map(|item| match item {
                syn::ImplItem::Fn(f) => Some(&f.sig.ident),
                syn::ImplItem::Const(c) => Some(&c.ident),
                syn::ImplItem::Type(t) => Some(&t.ident),
                _ => None,
            })
            .collect();
        let all = !names.is_empty() && names.len() == i.items.len();
        all && names.iter().all(|n| self.strip.contains(&n.to_string()))
            && names.iter().all(|n| self.strips(n))
    }

    /// Whether the whole `use` tree is stripped; the stripped parts of one
    /// that is not are removed.
    fn strip_use(&mut self, tree: &syn::UseTree) -> bool {
        match tree {
            syn::UseTree::Path(p) if self.strips(&p.ident) => {
                // Through a stripped module: the seam's names it imports are
                // stripped with it.
                self.note_use(&p.tree);
                true
            }
            syn::UseTree::Path(p) => self.strip_use(&p.tree),
            syn::UseTree::Name(n) => self.strips(&n.ident),
            syn::UseTree::Rename(r) => self.strips(&r.ident),
            syn::UseTree::Glob(_) => false,
            syn::UseTree::Group(g) => {
                let dead: Vec<&syn::UseTree> = g.items.iter().filter(|t| self.strip_use(t)).collect();
                if dead.len() == g.items.len() {
                    return true;
                }
                for t in dead {
                    let (start, end) = self.range(t.span());
                    self.remove(start, end);
                }
                false
            }
        }
    }

    /// Counts the seam's names that the `use` tree imports as found.
    fn note_use(&mut self, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                self.strips(&p.ident);
                self.note_use(&p.tree);
            }
            syn::UseTree::Name(n) => _ = self.strips(&n.ident),
            syn::UseTree::Rename(r) => _ = self.strips(&r.ident),
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.note_use(t)),
        }
    }

    /// Whether the statement is the seam's alone, so that it goes with it:
    /// a call of a stripped function or method for nothing but its effect
    /// (`f(...);`, `x.f(...);`); a simple statement or a `let` that reads the
    /// seam (a field `x.NAME` or a path through `NAME`, in a call, a `?`, an
    /// `.await`, an operation or a `match`'s scrutinee: `x.NAME.check()?;`,
    /// `let v = NAME::hook(v);`, which only rebind what the core had); or an
    /// `if` without `else` that does nothing else, or an `if let` without
    /// `else` whose scrutinee reads the seam. Counts the names as found.
    fn strips_call(&mut self, stmt: &syn::Stmt) -> bool {
        self.seam_stmt(stmt, false) && self.seam_stmt(stmt, true)
    }

    /// See `strips_call`; counts the names as found only when `mark`.
    fn seam_stmt(&mut self, stmt: &syn::Stmt, mark: bool) -> bool {
        let name = match stmt {
            syn::Stmt::Expr(syn::Expr::If(i), _) if i.else_branch.is_none() => {
                if let syn::Expr::Let(l) = &*i.cond
                    && let Some(name) = self.reads_seam(&l.expr)
                {
                    return !mark || self.strips(&name);
                }
                let stmts = &i.then_branch.stmts;
                return !stmts.is_empty() && stmts.iter().all(|s| self.seam_stmt(s, mark));
            }
            syn::Stmt::Expr(syn::Expr::MethodCall(m), Some(_))
                if self.strip.contains(&m.method.to_string()) =>
            {
                m.method.clone()
            }
            syn::Stmt::Expr(syn::Expr::Call(c), Some(_)) if self.callee(c).is_some() => {
                self.callee(c).cloned().expect("checked")
            }
            syn::Stmt::Expr(e, Some(_)) => match self.reads_seam(e) {
                Some(name) => name,
                None => return false,
            },
            syn::Stmt::Local(syn::Local {
                init: Some(syn::LocalInit {
                    expr, diverge: None, ..
                }),
                ..
            }) => match self.reads_seam(expr) {
                Some(name) => name,
                None => return false,
            },
            _ => return false,
        };
        if mark { self.strips(&name) } else { true }
    }

    /// The called function's name, if it is stripped.
    fn callee<'e>(&self, c: &'e syn::ExprCall) -> Option<&'e syn::Ident> {
        match &*c.func {
            syn::Expr::Path(p) => p.path.segments.last().map(|last| &last.ident),
            _ => None,
        }
        .filter(|name| self.strip.contains(&name.to_string()))
    }

    /// The stripped name a simple expression reads (see `strips_call`).
    fn reads_seam(&self, expr: &syn::Expr) -> Option<syn::Ident> {
        use syn::Expr;
        let expr = match expr {
            Expr::Match(m) => &*m.expr,
            Expr::Call(_)
            | Expr::MethodCall(_)
            | Expr::Try(_)
            | Expr::Await(_)
            | Expr::Field(_)
            | Expr::Binary(_) => expr,
            _ => return None,
        };
        let mut reads = Reads {
            strip: self.strip,
            found: None,
        };
        reads.visit_expr(expr);
        reads.found
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
        let attrs = item_attrs(i);
        if self.decide(attrs, i.span()) {
            return;
        }
        let stripped = match i {
            syn::Item::Use(u) => self.strip_use(&u.tree),
            _ => self.strips_item(i),
        };
        if stripped {
            self.remove_node(attrs, i.span());
        } else {
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
        if self.decide(attrs, i.span()) {
            return;
        }
        let stripped = match i {
            syn::ImplItem::Const(x) => self.strips(&x.ident),
            syn::ImplItem::Fn(x) => self.strips(&x.sig.ident),
            syn::ImplItem::Type(x) => self.strips(&x.ident),
            _ => false,
        };
        if stripped {
            self.remove_node(attrs, i.span());
        } else {
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
        if self.decide(attrs, i.span()) {
            return;
        }
        let stripped = match i {
            syn::TraitItem::Const(x) => self.strips(&x.ident),
            syn::TraitItem::Fn(x) => self.strips(&x.sig.ident),
            syn::TraitItem::Type(x) => self.strips(&x.ident),
            _ => false,
        };
        if stripped {
            self.remove_node(attrs, i.span());
        } else {
            visit::visit_trait_item(self, i);
        }
    }

    fn visit_field(&mut self, f: &'ast syn::Field) {
        if self.decide(&f.attrs, f.span()) {
            return;
        }
        if f.ident.as_ref().is_some_and(|i| self.strips(i)) {
            self.remove_node(&f.attrs, f.span());
        } else {
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
        if self.decide(&f.attrs, f.span()) {
            return;
        }
        if let syn::Member::Named(name) = &f.member
            && self.strips(name)
        {
            self.remove_node(&f.attrs, f.span());
        } else {
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
        if self.decide(attrs, s.span()) {
            return;
        }
        if self.strips_call(s) {
            self.remove_node(attrs, s.span());
        } else {
            visit::visit_stmt(self, s);
        }
    }
}

/// Finds a stripped name read in an expression: a field (`x.NAME`) or a
/// module a path goes through (`NAME::f`); a plain name (`NAME`) is a local
/// as often as not, and closures and blocks are code of their own: neither
/// counts.
struct Reads<'s> {
    strip: &'s BTreeSet<String>,
    found: Option<syn::Ident>,
}

impl Reads<'_> {
    fn hit(&mut self, name: &syn::Ident) {
        if self.strip.contains(&name.to_string()) {
            self.found.get_or_insert_with(|| name.clone());
        }
    }
}

impl<'ast> Visit<'ast> for Reads<'_> {
    fn visit_member(&mut self, m: &'ast syn::Member) {
        if let syn::Member::Named(name) = m {
            self.hit(name);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let through = path.segments.len().saturating_sub(1);
        path.segments
            .iter()
            .take(through)
            .for_each(|s| self.hit(&s.ident));
        visit::visit_path(self, path);
    }

    fn visit_path_segment(&mut self, segment: &'ast syn::PathSegment) {
        visit::visit_path_arguments(self, &segment.arguments);
    }

    fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}

    fn visit_expr_block(&mut self, _: &'ast syn::ExprBlock) {}

    fn visit_expr_async(&mut self, _: &'ast syn::ExprAsync) {}
}

fn main() -> ExitCode {
    let usage = "usage: upstream-gen FILE [--strip NAME]... [FEATURE...]";
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let mut features = BTreeSet::new();
    let mut strip = BTreeSet::new();
    while let Some(arg) = args.next() {
        if arg == "--strip" {
            let Some(name) = args.next() else {
                eprintln!("{usage}");
                return ExitCode::from(2);
            };
            strip.insert(name);
        } else {
            features.insert(arg);
        }
    }
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("upstream-gen: {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (out, stripped) = match generate(&text, &features, &strip) {
        Ok(generated) => generated,
        Err(e) => {
            let at = e.span().start();
            eprintln!("upstream-gen: {path}:{}:{}: {e}", at.line, at.column + 1);
            return ExitCode::FAILURE;
        }
    };
    for name in &stripped {
        eprintln!("upstream-gen: stripped {name}");
    }
    print!("{out}");
    ExitCode::SUCCESS
}

/// `text` as it reads with exactly `features` on and the seams `strip`
/// stripped; with the names of `strip` found.
fn generate(
    text: &str,
    features: &BTreeSet<String>,
    strip: &BTreeSet<String>,
) -> syn::Result<(String, BTreeSet<String>)> {
    let file = syn::parse_file(text)?;
    let lines = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let mut g = Gen {
        text,
        lines,
        features,
        strip,
        stripped: BTreeSet::new(),
        edits: Vec::new(),
    };
    for item in &file.items {
        g.visit_item(item);
    }
    let mut edits = g.edits;
    edits.sort_by_key(|e| std::cmp::Reverse(e.start));
    let mut out = text.to_owned();
    let mut floor = usize::MAX;
    for e in edits {
        // Nested or overlapping edits: the outer one was applied.
        if e.end > floor {
            continue;
        }
        out.replace_range(e.start..e.end, &e.with);
        floor = e.start;
    }
    Ok((out, g.stripped))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::generate;

    /// The lines of `text` generated with no feature on and `strip`
    /// stripped, blank lines dropped, each trimmed.
    fn stripped(text: &str, strip: &[&str]) -> Vec<String> {
        let strip: BTreeSet<String> = strip.iter().map(ToString::to_string).collect();
        let (out, _) = generate(text, &BTreeSet::new(), &strip).expect("parses");
        out.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(ToOwned::to_owned)
            .collect()
    }

    #[test]
    fn a_statement_reading_a_seam_goes_with_it() {
        let text = "fn f(&self, grace: u32) -> u32 {
            self.extras.validate(&self.identity)?;
            let grace = grace + self.extras.bound();
            let (a, b) = extras::set_up(a, b);
            let rule = match extras::rule(self, rule) {
                Ok(rule) => rule,
                Err(e) => return e,
            };
            grace
        }";
        assert_eq!(
            stripped(text, &["extras"]),
            ["fn f(&self, grace: u32) -> u32 {", "grace", "}"]
        );
    }

    #[test]
    fn an_if_whose_condition_reads_a_seam_goes_with_it() {
        let text = "fn f() -> u64 {
            #[cfg(test)]
            if let Some(bits) = crate::tests::simulation::seeded_bits() {
                return bits;
            }
            if let Some(bits) = kept() {
                return bits;
            }
            if extras::on() {
                return 1;
            }
            if let Some(x) = extras::hook() {
                return x;
            } else {
                return 2;
            }
        }";
        assert_eq!(
            stripped(text, &["simulation", "extras"]),
            [
                "fn f() -> u64 {",
                "if let Some(bits) = kept() {",
                "return bits;",
                "}",
                "if extras::on() {",
                "return 1;",
                "}",
                "if let Some(x) = extras::hook() {",
                "return x;",
                "} else {",
                "return 2;",
                "}",
                "}",
            ],
        );
    }

    #[test]
    fn a_local_of_a_seams_name_and_code_in_closures_stay() {
        let text = "fn f() {
            let observer = make();
            observer.status();
            run(|| extras::hook());
            let kept = async { self.extras.x() };
        }";
        assert_eq!(
            stripped(text, &["extras", "observer"]),
            [
                "fn f() {",
                "let observer = make();",
                "observer.status();",
                "run(|| extras::hook());",
                "let kept = async { self.extras.x() };",
                "}",
            ],
        );
    }

    #[test]
    fn a_false_cfg_removes_its_item_and_a_call_of_a_stripped_method_goes() {
        let text = "#[cfg(feature = \"x\")]
            fn gone() {}
            fn kept(&self) {
                self.tell(1);
                self.keep(2);
            }";
        assert_eq!(
            stripped(text, &["tell"]),
            ["fn kept(&self) {", "self.keep(2);", "}"]
        );
    }
}
