//! Configuration from the environment (`EDWARD_MODEL` and the provider
//! variables). One test per binary: it changes the process environment.
#![cfg(all(feature = "openai", feature = "anthropic", feature = "gemini"))]

mod providers_support;

use edward_core::providers::{self, ProviderConfigError};
use providers_support::*;

fn set(var: &str, value: Option<&str>) {
    // SAFETY: this test binary has a single test; nothing else reads or
    // writes the environment concurrently.
    unsafe {
        match value {
            Some(v) => std::env::set_var(var, v),
            None => std::env::remove_var(var),
        }
    }
}

#[tokio::test]
async fn edward_model_selects_and_configures_the_provider() {
    for v in [
        "EDWARD_MODEL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "GEMINI_API_KEY",
        "GEMINI_BASE_URL",
    ] {
        set(v, None);
    }
    assert!(providers::from_env().unwrap().is_none());

    set("EDWARD_MODEL", Some("gpt-4o"));
    assert!(matches!(
        providers::from_env(),
        Err(ProviderConfigError::InvalidModelSpec { .. })
    ));

    set("EDWARD_MODEL", Some("openai:gpt-4o-mini"));
    assert_eq!(
        providers::from_env().unwrap_err(),
        ProviderConfigError::MissingEnv {
            var: "OPENAI_API_KEY".into()
        }
    );

    set("EDWARD_MODEL", Some("anthropic:claude-sonnet-4-20250514"));
    assert!(matches!(
        providers::from_env(),
        Err(ProviderConfigError::MissingEnv { var }) if var == "ANTHROPIC_API_KEY"
    ));

    // A key set: the client is built, its Debug hides the key.
    set("GEMINI_API_KEY", Some(KEY));
    set("EDWARD_MODEL", Some("gemini:gemini-2.5-flash"));
    let selected = providers::from_env().unwrap().unwrap();
    assert_eq!(selected.client.provider(), "gemini");
    assert_eq!(selected.model, "gemini-2.5-flash");
    assert!(!format!("{selected:?}").contains(KEY));

    // A local OpenAI-compatible server: base URL from the environment, no key needed.
    let server = TestServer::start(vec![Reply::sse(fixture("openai", "text.sse"))]).await;
    set("OPENAI_BASE_URL", Some(&format!("{}/v1", server.base_url)));
    set("EDWARD_MODEL", Some("openai:llama3.1:8b"));
    let selected = providers::from_env().unwrap().unwrap();
    assert_eq!(selected.client.provider(), "openai");
    assert_eq!(selected.model, "llama3.1:8b");
    let c = run(&*selected.client, request(&selected.model)).await;
    assert_eq!(c.error, None);
    assert_eq!(c.text, FIXTURE_TEXT);
    let r = &server.requests()[0];
    assert_eq!(r.uri, "/v1/chat/completions");
    assert_eq!(r.body["model"], "llama3.1:8b");
    assert!(r.headers.get("authorization").is_none());

    set("EDWARD_MODEL", Some("mistral:large"));
    assert!(matches!(
        providers::from_env(),
        Err(ProviderConfigError::UnsupportedProvider { .. })
    ));
}
