//! Which framework a chat's project uses, decided before the first model
//! call from `package.json` and the file list (a pure function).

use serde::{Deserialize, Serialize};

/// A project's framework as Edward detects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Framework {
    /// Next.js (`next` dependency).
    Next,
    /// Astro (`astro` dependency).
    Astro,
    /// SvelteKit (`@sveltejs/kit`), or Svelte without Vite.
    Svelte,
    /// Vite as the build tool (with React, Vue, Svelte or plain).
    Vite,
    /// Vue without Vite (`vue`, `nuxt`).
    Vue,
    /// React without Vite or Next (`react-scripts`, `react`).
    React,
    /// A plain static site: `index.html` at the root, no `package.json` framework.
    Static,
    /// No project yet (or nothing recognisable).
    None,
}

impl Framework {
    /// The snake_case name (`next`, `vite`, …, `static`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            Framework::Next => "next",
            Framework::Astro => "astro",
            Framework::Svelte => "svelte",
            Framework::Vite => "vite",
            Framework::Vue => "vue",
            Framework::React => "react",
            Framework::Static => "static",
            Framework::None => "none",
        }
    }

    /// Parse a name as written in an `<edward_install>` body's
    /// `framework:` line (case-insensitive; `nextjs`, `sveltekit`, `html`
    /// and `plain` are accepted aliases). `None` for an unknown name.
    pub fn from_name(name: &str) -> Option<Framework> {
        Some(match name.trim().to_ascii_lowercase().as_str() {
            "next" | "nextjs" | "next.js" => Framework::Next,
            "astro" => Framework::Astro,
            "svelte" | "sveltekit" => Framework::Svelte,
            "vite" => Framework::Vite,
            "vue" | "nuxt" => Framework::Vue,
            "react" | "cra" => Framework::React,
            "static" | "html" | "plain" => Framework::Static,
            "none" => Framework::None,
            _ => return None,
        })
    }
}

/// A detection and the fact it rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detection {
    /// The framework.
    pub framework: Framework,
    /// Why, for people: `package.json dependency "next"`, `index.html at the root`, …
    pub evidence: String,
}

/// Dependencies that identify a framework, in precedence order: a
/// meta-framework wins over the build tool, the build tool over the UI
/// library (a Vite + React app is `vite`).
const RULES: &[(&str, Framework)] = &[
    ("next", Framework::Next),
    ("astro", Framework::Astro),
    ("@sveltejs/kit", Framework::Svelte),
    ("vite", Framework::Vite),
    ("nuxt", Framework::Vue),
    ("vue", Framework::Vue),
    ("svelte", Framework::Svelte),
    ("react-scripts", Framework::React),
    ("react", Framework::React),
];

/// Detect the framework from the root `package.json` text (if any), the
/// workspace's file paths, and the framework the chat recorded from an
/// `<edward_install>` body (if any).
///
/// Order: a framework dependency in `package.json` (`dependencies` and
/// `devDependencies`, precedence as in [`RULES`]); else the recorded
/// framework; else `index.html` at the root (`static`); else `none`. An
/// unreadable `package.json` is evidence too ("not valid JSON"), never a
/// failure.
pub fn detect_framework(
    package_json: Option<&str>,
    files: &[&str],
    recorded: Option<Framework>,
) -> Detection {
    let mut unreadable = None;
    if let Some(text) = package_json {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) => {
                let has = |dep: &str| {
                    ["dependencies", "devDependencies"]
                        .iter()
                        .any(|section| v.get(section).and_then(|d| d.get(dep)).is_some())
                };
                if let Some((dep, fw)) = RULES.iter().find(|(dep, _)| has(dep)) {
                    return Detection {
                        framework: *fw,
                        evidence: format!("package.json dependency \"{dep}\""),
                    };
                }
            }
            Err(e) => unreadable = Some(format!("package.json is not valid JSON ({e})")),
        }
    }
    if let Some(fw) = recorded.filter(|f| *f != Framework::None) {
        return Detection {
            framework: fw,
            evidence: "recorded from an <edward_install> framework: line".into(),
        };
    }
    let suffix = unreadable.map(|u| format!("; {u}")).unwrap_or_default();
    if files.contains(&"index.html") {
        return Detection {
            framework: Framework::Static,
            evidence: format!("index.html at the root{suffix}"),
        };
    }
    Detection {
        framework: Framework::None,
        evidence: if files.is_empty() {
            "the workspace is empty".into()
        } else {
            format!("no framework dependency and no index.html{suffix}")
        },
    }
}

/// Whether `package.json` declares a non-empty `build` script (a project
/// without one gets no build job).
pub fn build_script(package_json: Option<&str>) -> bool {
    package_json
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .and_then(|v| {
            v.get("scripts")?
                .get("build")?
                .as_str()
                .map(|s| !s.is_empty())
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_table() {
        let pj = |deps: &str, dev: &str| {
            format!(r#"{{"dependencies":{{{deps}}},"devDependencies":{{{dev}}}}}"#)
        };
        #[allow(clippy::type_complexity)]
        let cases: Vec<(
            Option<String>,
            Vec<&str>,
            Option<Framework>,
            Framework,
            &str,
        )> = vec![
            (
                Some(pj(r#""next":"14","react":"18""#, "")),
                vec!["package.json"],
                None,
                Framework::Next,
                "\"next\"",
            ),
            (
                Some(pj(r#""react":"18""#, r#""vite":"5""#)),
                vec![],
                None,
                Framework::Vite,
                "\"vite\"",
            ),
            (
                Some(pj(r#""vue":"3""#, r#""vite":"5""#)),
                vec![],
                None,
                Framework::Vite,
                "\"vite\"",
            ),
            (
                Some(pj(r#""vue":"3""#, "")),
                vec![],
                None,
                Framework::Vue,
                "\"vue\"",
            ),
            (
                Some(pj("", r#""@sveltejs/kit":"2","vite":"5""#)),
                vec![],
                None,
                Framework::Svelte,
                "@sveltejs/kit",
            ),
            (
                Some(pj(r#""astro":"4""#, "")),
                vec![],
                None,
                Framework::Astro,
                "\"astro\"",
            ),
            (
                Some(pj(r#""react":"18","react-scripts":"5""#, "")),
                vec![],
                None,
                Framework::React,
                "react-scripts",
            ),
            (
                Some(pj(r#""lodash":"4""#, "")),
                vec!["index.html"],
                None,
                Framework::Static,
                "index.html",
            ),
            (
                Some(pj(r#""lodash":"4""#, "")),
                vec!["index.html"],
                Some(Framework::Vite),
                Framework::Vite,
                "edward_install",
            ),
            (
                Some(pj(r#""next":"14""#, "")),
                vec![],
                Some(Framework::Vite),
                Framework::Next,
                "\"next\"",
            ),
            (
                None,
                vec!["index.html", "style.css"],
                None,
                Framework::Static,
                "index.html",
            ),
            (
                None,
                vec!["src/app.py"],
                None,
                Framework::None,
                "no framework",
            ),
            (None, vec![], None, Framework::None, "empty"),
            (
                Some("{not json".into()),
                vec!["index.html"],
                None,
                Framework::Static,
                "not valid JSON",
            ),
            (Some("[]".into()), vec![], None, Framework::None, "empty"),
        ];
        for (pkg, files, recorded, want, evidence) in cases {
            let got = detect_framework(pkg.as_deref(), &files, recorded);
            assert_eq!(got.framework, want, "{pkg:?} {files:?} {recorded:?}");
            assert!(
                got.evidence.contains(evidence),
                "{:?} lacks {evidence}",
                got.evidence
            );
        }
    }

    #[test]
    fn names_round_trip_and_aliases() {
        for fw in [
            Framework::Next,
            Framework::Astro,
            Framework::Svelte,
            Framework::Vite,
            Framework::Vue,
            Framework::React,
            Framework::Static,
            Framework::None,
        ] {
            assert_eq!(Framework::from_name(fw.as_str()), Some(fw));
        }
        assert_eq!(Framework::from_name(" NextJS "), Some(Framework::Next));
        assert_eq!(Framework::from_name("sveltekit"), Some(Framework::Svelte));
        assert_eq!(Framework::from_name("rails"), None);
    }

    #[test]
    fn build_script_only_when_declared() {
        assert!(build_script(Some(r#"{"scripts":{"build":"vite build"}}"#)));
        assert!(!build_script(Some(r#"{"scripts":{"dev":"vite"}}"#)));
        assert!(!build_script(Some(r#"{"scripts":{"build":""}}"#)));
        assert!(!build_script(Some("nope")));
        assert!(!build_script(None));
    }
}
