//! Names and selectors as the API server takes them, and a LIST read to its end.

use kube::Api;
use kube::api::ListParams;

/// Items asked for per page of a LIST.
pub(super) const PAGE: u32 = 500;
/// The most pages one LIST may take: a server that keeps answering `continue` past this is
/// a failed read, not an endless one.
pub(super) const MAX_PAGES: usize = 200;
/// The most bytes one answer of the API server may be.
pub(super) const MAX_ANSWER: usize = 32 * 1024 * 1024;

/// Every object a LIST matches, read page by page to its end (`limit`/`continue`), for
/// reads outside [`LiveReader`] (the pods a drain must move): a first page is never taken
/// for the whole list. A list that repeats a `continue` token, or has not ended after
/// [`MAX_PAGES`] pages, is an error.
pub async fn list_complete<K>(api: &Api<K>, params: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let incomplete = |why: &str| {
        kube::Error::Api(Box::new(
            kube::core::Status::failure(&format!("an incomplete list: {why}"), "IncompleteList")
                .with_code(500),
        ))
    };
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut page_params = params.clone().limit(PAGE);
        if let Some(t) = &token {
            page_params = page_params.continue_token(t);
        }
        let page = api.list(&page_params).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            None => return Ok(out),
            Some(t) if token.as_deref() == Some(t.as_str()) => {
                return Err(incomplete(
                    "the API server answered the same `continue` token twice",
                ));
            }
            Some(t) => token = Some(t),
        }
    }
    Err(incomplete(&format!(
        "the list did not end within {MAX_PAGES} pages of {PAGE}"
    )))
}

/// Whether `s` is a Kubernetes object name (an RFC 1123 subdomain): anything else cannot
/// name an object, and would not make a sound URL path.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Whether `s` is a namespace name (an RFC 1123 label).
pub fn valid_namespace(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && valid_name(s)
}

/// The field every cluster-scoped LIST selects on: declared `selectableFields` on the
/// TalosMachine and TalosOperation CRDs (Kubernetes >= 1.32), so the API server filters on
/// the field the facts compare, `spec.clusterRef.name`, and not on a label a person could
/// leave out.
pub const CLUSTER_FIELD: &str = "spec.clusterRef.name";

/// `value` escaped for a field selector (`fields.EscapeValue`: `\`, `,` and `=`), so any
/// cluster name selects exactly itself.
pub fn escape_field_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The field selector of one cluster's objects.
pub fn cluster_selector(cluster: &str) -> String {
    format!("{CLUSTER_FIELD}={}", escape_field_value(cluster))
}
