//! Bad input never panics: arbitrary text through the whole front end, and arbitrary JSON
//! through the AdmissionReview path.

use ichor_rules::diagnostics::SourceFile;
use proptest::prelude::*;

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("rule r ".to_string()),
        Just("let a = ".to_string()),
        Just("refuse remove controlplane ".to_string()),
        Just("hold apply controlplane ".to_string()),
        Just("when ".to_string()),
        Just("unless ".to_string()),
        Just("say \"x {approved} y\" ".to_string()),
        Just("reason R ".to_string()),
        Just("plan remove controlplane do lock cluster ".to_string()),
        Just("allow approve worker ".to_string()),
        Just("approved ".to_string()),
        Just("count / 0 ".to_string()),
        Just("a ".to_string()),
        Just("( ".to_string()),
        Just(") ".to_string()),
        Just("and not ".to_string()),
        Just("== \"reset\" ".to_string()),
        Just("9223372036854775807 + 1 ".to_string()),
        Just("{ ".to_string()),
        Just("\" ".to_string()),
        Just("# c\n".to_string()),
        "[ -~\n]{0,8}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_front_end_never_panics(tokens in proptest::collection::vec(token(), 0..40)) {
        let text: String = tokens.concat();
        let set = ichor_rules::ruleset::build(vec![SourceFile::new("fuzz.rules", text)]);
        // Rendering must not panic either.
        let _ = ichor_rules::diagnostics::render_human(&set.diagnostics, &set.files, false);
        let _ = ichor_rules::diagnostics::to_json(&set.diagnostics, &set.files);
    }

    #[test]
    fn reviews_never_panic(body in "[ -~]{0,200}") {
        let _ = ichor_rules::runtime::admission::parse_review(body.as_bytes());
    }
}

#[test]
fn reviews_with_wrong_shapes_are_errors() {
    for body in [
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":1}}"#,
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"ichor.maesh.dev","version":"v1alpha1","kind":"TalosMachine"},"resource":{"group":"ichor.maesh.dev","version":"v1alpha1","resource":"talosmachines"},"operation":"CREATE","userInfo":{},"object":{"apiVersion":"ichor.maesh.dev/v1alpha1","kind":"TalosMachine","metadata":{"name":"m"},"spec":{"role":"boss"}}}}"#,
    ] {
        assert!(
            ichor_rules::runtime::admission::parse_review(body.as_bytes()).is_err(),
            "{body}"
        );
    }
}
