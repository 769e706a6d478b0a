//! Whether a tool call may run: a pure function of rules, the approval mode and the call.
//!
//! A rule is `{tool: GLOB, match?: GLOB, action: allow|ask|deny}`. `tool` matches the tool's
//! name; `match` (absent = anything) matches the call's [`Subject`]: for paths `*` stays within
//! one directory and `**` crosses them, for commands and inputs `*` matches anything. Among all
//! rules that match — server rules and session rules alike — the most restrictive wins
//! (`deny` > `ask` > `allow`), so their order never matters and a session can never loosen
//! what the server denies or asks. When no rule matches, the read-only tools are allowed and
//! everything else asks. With approval mode `deny` (no human to ask), an ask becomes a denial.

use std::cmp::Reverse;

use globset::{Glob, GlobBuilder, GlobMatcher};
use serde::{Deserialize, Serialize};

use super::{Subject, SubjectKind};

/// The tools allowed when no rule says otherwise: they only read the workspace.
pub const ALLOWED_BY_DEFAULT: [&str; 4] = ["list_files", "read_file", "glob", "grep"];

pub use crate::model::{Action, Rule};

/// The rule an "always" approval adds: this tool, exactly this subject, allowed.
pub fn always_allow(tool: &str, subject: &Subject) -> Rule {
    Rule {
        tool: globset::escape(tool),
        subject: Some(globset::escape(&subject.text)),
        action: Action::Allow,
    }
}

/// What `ask` means where no human may answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalMode {
    #[default]
    Ask,
    Deny,
}

/// Which set a rule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    Server,
    Session,
}

/// A rule with a glob that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {index}: invalid glob {glob:?}: {message}")]
pub struct RuleError {
    pub index: usize,
    pub glob: String,
    pub message: String,
}

/// Rules with their globs compiled, ready to match calls.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    compiled: Vec<Compiled>,
}

#[derive(Debug, Clone)]
struct Compiled {
    rule: Rule,
    tool: GlobMatcher,
    /// `(for paths, for everything else)`.
    subject: Option<(GlobMatcher, GlobMatcher)>,
}

impl Rules {
    pub fn compile(rules: Vec<Rule>) -> Result<Rules, RuleError> {
        let mut compiled = Rules::default();
        for rule in rules {
            compiled.push(rule)?;
        }
        Ok(compiled)
    }

    /// Adds a rule (an "always" approval adds one to the session's set).
    pub fn push(&mut self, rule: Rule) -> Result<(), RuleError> {
        let index = self.compiled.len();
        let glob = |pattern: &str, literal_separator: bool| {
            GlobBuilder::new(pattern)
                .literal_separator(literal_separator)
                .build()
                .map(|g: Glob| g.compile_matcher())
                .map_err(|e| RuleError {
                    index,
                    glob: pattern.to_owned(),
                    message: e.kind().to_string(),
                })
        };
        let tool = glob(&rule.tool, false)?;
        let subject = match &rule.subject {
            Some(pattern) => Some((glob(pattern, true)?, glob(pattern, false)?)),
            None => None,
        };
        self.compiled.push(Compiled {
            rule,
            tool,
            subject,
        });
        Ok(())
    }

    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.compiled.iter().map(|c| &c.rule)
    }

    /// Whether a rule for `tool` has a subject pattern: only then does what the rules say of a
    /// call of it depend on the call's subject.
    pub fn read_subject_of(&self, tool: &str) -> bool {
        self.compiled
            .iter()
            .any(|c| c.subject.is_some() && c.tool.is_match(tool))
    }

    fn matching<'a>(
        &'a self,
        tool: &'a str,
        subject: &'a Subject,
    ) -> impl Iterator<Item = (usize, &'a Rule)> + 'a {
        self.compiled
            .iter()
            .enumerate()
            .filter(move |(_, c)| {
                c.tool.is_match(tool)
                    && c.subject
                        .as_ref()
                        .is_none_or(|(path, other)| match subject.kind {
                            SubjectKind::Path => path.is_match(&subject.text),
                            SubjectKind::Command | SubjectKind::Input => {
                                other.is_match(&subject.text)
                            }
                        })
            })
            .map(|(i, c)| (i, &c.rule))
    }
}

/// The rule that decided a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecidingRule {
    pub origin: Origin,
    /// Its position in its set.
    pub index: usize,
    pub rule: Rule,
}

/// What policy says about one call, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub action: Action,
    /// The most restrictive matching rule (the first such, server rules before session
    /// rules); `None` when no rule matched and the tool's default applied.
    pub rule: Option<DecidingRule>,
    /// An `ask` turned into `deny` by approval mode `deny` (recorded as decided by policy).
    pub by_approval_mode: bool,
}

/// Decides a call of `tool` with `subject` under the server's and the session's rules.
pub fn decide(
    server: &Rules,
    session: &Rules,
    mode: ApprovalMode,
    tool: &str,
    subject: &Subject,
) -> Decision {
    let strongest = server
        .matching(tool, subject)
        .map(|(index, rule)| (Origin::Server, index, rule))
        .chain(
            session
                .matching(tool, subject)
                .map(|(index, rule)| (Origin::Session, index, rule)),
        )
        // Most restrictive first; among equals, server before session, then in order.
        .min_by_key(|(origin, index, rule)| (Reverse(rule.action), *origin, *index));
    let (action, rule) = match strongest {
        Some((origin, index, rule)) => (
            rule.action,
            Some(DecidingRule {
                origin,
                index,
                rule: rule.clone(),
            }),
        ),
        None => (default_action(tool), None),
    };
    match (action, mode) {
        (Action::Ask, ApprovalMode::Deny) => Decision {
            action: Action::Deny,
            rule,
            by_approval_mode: true,
        },
        _ => Decision {
            action,
            rule,
            by_approval_mode: false,
        },
    }
}

/// The action for a tool no rule matches.
pub fn default_action(tool: &str) -> Action {
    if ALLOWED_BY_DEFAULT.contains(&tool) {
        Action::Allow
    } else {
        Action::Ask
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(value: serde_json::Value) -> Rules {
        Rules::compile(serde_json::from_value(value).expect("rules parse")).expect("globs")
    }

    fn path(text: &str) -> Subject {
        Subject {
            kind: SubjectKind::Path,
            text: text.into(),
        }
    }

    fn command(text: &str) -> Subject {
        Subject {
            kind: SubjectKind::Command,
            text: text.into(),
        }
    }

    fn action(server: &Rules, session: &Rules, tool: &str, subject: &Subject) -> Action {
        decide(server, session, ApprovalMode::Ask, tool, subject).action
    }

    #[test]
    fn only_rules_with_a_subject_pattern_read_the_subject_of_their_tools() {
        let set = rules(json!([
            {"tool": "shell", "action": "ask"},
            {"tool": "write_*", "match": "src/**", "action": "allow"},
        ]));
        assert!(!set.read_subject_of("shell"));
        assert!(set.read_subject_of("write_file"));
        assert!(!set.read_subject_of("read_file"));
        assert!(!Rules::default().read_subject_of("write_file"));
        // Where no rule reads it, the decision is the same whatever the subject is.
        for subject in [path("src/a.rs"), command("rm -rf /"), Subject::UNREAD] {
            assert_eq!(
                action(&set, &Rules::default(), "shell", &subject),
                Action::Ask
            );
            assert_eq!(
                action(&set, &Rules::default(), "read_file", &subject),
                Action::Allow
            );
        }
    }

    #[test]
    fn defaults_allow_reading_and_ask_for_the_rest() {
        let none = Rules::default();
        for tool in ["list_files", "read_file", "glob", "grep"] {
            let d = decide(&none, &none, ApprovalMode::Ask, tool, &path("x"));
            assert_eq!(
                (d.action, d.rule, d.by_approval_mode),
                (Action::Allow, None, false)
            );
        }
        for tool in [
            "write_file",
            "edit_file",
            "shell",
            "mcp__git__log",
            "task",
            "READ_FILE",
        ] {
            assert_eq!(
                action(&none, &none, tool, &path("x")),
                Action::Ask,
                "{tool}"
            );
        }
    }

    #[test]
    fn the_most_restrictive_matching_rule_wins_whatever_the_order() {
        let set = json!([
            {"tool": "*", "action": "allow"},
            {"tool": "*_file", "match": "secrets/**", "action": "deny"},
            {"tool": "write_file", "action": "ask"},
        ]);
        let mut reversed = set.as_array().expect("array").clone();
        reversed.reverse();
        let none = Rules::default();
        for server in [rules(set), rules(json!(reversed))] {
            assert_eq!(
                action(&server, &none, "read_file", &path("secrets/key")),
                Action::Deny
            );
            assert_eq!(
                action(&server, &none, "write_file", &path("src/a.rs")),
                Action::Ask
            );
            assert_eq!(
                action(&server, &none, "shell", &command("ls")),
                Action::Allow
            );
            // Allowed by a rule even though its default is ask.
            assert_eq!(
                action(&server, &none, "edit_file", &path("src/a.rs")),
                Action::Allow
            );
        }
    }

    #[test]
    fn a_session_cannot_loosen_the_server() {
        let server = rules(json!([
            {"tool": "shell", "match": "rm *", "action": "deny"},
            {"tool": "write_file", "action": "ask"},
        ]));
        let session = rules(json!([
            {"tool": "*", "action": "allow"},
            {"tool": "shell", "match": "rm -rf /tmp/x", "action": "allow"},
        ]));
        let d = decide(
            &server,
            &session,
            ApprovalMode::Ask,
            "shell",
            &command("rm -rf /tmp/x"),
        );
        assert_eq!(d.action, Action::Deny);
        let decided = d.rule.expect("a rule decided");
        assert_eq!((decided.origin, decided.index), (Origin::Server, 0));
        assert_eq!(
            action(&server, &session, "write_file", &path("a")),
            Action::Ask
        );
        // Where the server says nothing, the session's rules apply (here: loosening a default).
        assert_eq!(
            action(&server, &session, "shell", &command("ls")),
            Action::Allow
        );
        // And a session may always tighten.
        let strict = rules(json!([{"tool": "read_file", "match": ".env", "action": "deny"}]));
        let d = decide(
            &server,
            &strict,
            ApprovalMode::Ask,
            "read_file",
            &path(".env"),
        );
        assert_eq!(d.action, Action::Deny);
        assert_eq!(d.rule.expect("rule").origin, Origin::Session);
    }

    #[test]
    fn ties_are_reported_as_the_server_rule_first() {
        let server =
            rules(json!([{"tool": "*", "action": "ask"}, {"tool": "shell", "action": "ask"}]));
        let session = rules(json!([{"tool": "shell", "action": "ask"}]));
        let d = decide(&server, &session, ApprovalMode::Ask, "shell", &command("x"));
        let rule = d.rule.expect("rule");
        assert_eq!(
            (rule.origin, rule.index, rule.rule.tool.as_str()),
            (Origin::Server, 0, "*")
        );
    }

    #[test]
    fn path_globs_respect_directories_and_command_globs_do_not() {
        let set = rules(json!([
            {"tool": "write_file", "match": "src/*.rs", "action": "allow"},
            {"tool": "edit_file", "match": "src/**", "action": "allow"},
            {"tool": "shell", "match": "git *", "action": "allow"},
        ]));
        let none = Rules::default();
        assert_eq!(
            action(&set, &none, "write_file", &path("src/a.rs")),
            Action::Allow
        );
        assert_eq!(
            action(&set, &none, "write_file", &path("src/x/a.rs")),
            Action::Ask
        );
        assert_eq!(
            action(&set, &none, "edit_file", &path("src/x/a.rs")),
            Action::Allow
        );
        assert_eq!(
            action(&set, &none, "edit_file", &path("srcx/a.rs")),
            Action::Ask
        );
        assert_eq!(
            action(&set, &none, "shell", &command("git log -- src/a/b")),
            Action::Allow
        );
        assert_eq!(action(&set, &none, "shell", &command("gitk")), Action::Ask);
        // The rule matches whole subjects, not prefixes.
        assert_eq!(
            action(&set, &none, "shell", &command("sudo git log")),
            Action::Ask
        );
    }

    #[test]
    fn approval_mode_deny_turns_asks_into_denials_only() {
        let server = rules(json!([{"tool": "shell", "match": "ls*", "action": "allow"}]));
        let none = Rules::default();
        let d = decide(&server, &none, ApprovalMode::Deny, "write_file", &path("a"));
        assert_eq!(
            (d.action, d.by_approval_mode, d.rule),
            (Action::Deny, true, None)
        );
        let d = decide(
            &server,
            &none,
            ApprovalMode::Deny,
            "shell",
            &command("ls -l"),
        );
        assert_eq!((d.action, d.by_approval_mode), (Action::Allow, false));
        let deny = rules(json!([{"tool": "shell", "action": "deny"}]));
        let d = decide(&deny, &none, ApprovalMode::Deny, "shell", &command("ls"));
        assert_eq!((d.action, d.by_approval_mode), (Action::Deny, false));
    }

    #[test]
    fn always_rules_match_exactly_that_subject() {
        let tricky = command("rm -rf build/*.o [x] {a,b}");
        let mut session = Rules::default();
        session
            .push(always_allow("shell", &tricky))
            .expect("escaped globs compile");
        let none = Rules::default();
        assert_eq!(action(&none, &session, "shell", &tricky), Action::Allow);
        assert_eq!(
            action(
                &none,
                &session,
                "shell",
                &command("rm -rf build/anything.o [x] {a,b}")
            ),
            Action::Ask
        );
        assert_eq!(
            action(&none, &session, "shell", &command("rm -rf build/*.o x a")),
            Action::Ask
        );
        let file = always_allow("write_file", &path("notes/*.md"));
        assert_eq!(file.action, Action::Allow);
        session.push(file).expect("compiles");
        assert_eq!(
            action(&none, &session, "write_file", &path("notes/*.md")),
            Action::Allow
        );
        assert_eq!(
            action(&none, &session, "write_file", &path("notes/a.md")),
            Action::Ask
        );
    }

    #[test]
    fn rules_round_trip_and_bad_ones_are_refused() {
        let rule: Rule =
            serde_json::from_value(json!({"tool": "shell", "match": "ls", "action": "deny"}))
                .expect("parses");
        assert_eq!(serde_json::to_value(&rule).expect("json")["match"], "ls");
        let open: Rule =
            serde_json::from_value(json!({"tool": "*", "action": "ask"})).expect("parses");
        assert!(serde_json::to_value(&open)
            .expect("json")
            .get("match")
            .is_none());
        for bad in [
            json!({"tool": "shell", "action": "maybe"}),
            json!({"tool": "shell"}),
            json!({"action": "allow"}),
            json!({"tool": "shell", "action": "allow", "mach": "ls"}),
            json!({"tool": 1, "action": "allow"}),
        ] {
            assert!(
                serde_json::from_value::<Rule>(bad.clone()).is_err(),
                "{bad}"
            );
        }
        let err = Rules::compile(vec![
            Rule {
                tool: "*".into(),
                subject: None,
                action: Action::Allow,
            },
            Rule {
                tool: "shell".into(),
                subject: Some("a[".into()),
                action: Action::Deny,
            },
        ])
        .expect_err("unclosed class");
        assert_eq!(err.index, 1);
        assert_eq!(err.glob, "a[");
        assert_eq!(
            serde_json::to_value(ApprovalMode::Deny).expect("json"),
            "deny"
        );
        assert_eq!(ApprovalMode::default(), ApprovalMode::Ask);
    }
}
