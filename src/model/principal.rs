//! Who makes a request, and what that lets it reach (SPEC §17).
//!
//! A [`Principal`] is resolved once per request by the HTTP layer (from a deployment token, a
//! key, a JWT or a session token) and handed to the session layer, which decides with it:
//! every agent, session, vault and key belongs to a tenant, and a principal reaches only its
//! own tenant's (an operator reaches every tenant's). What another tenant owns is answered as
//! if it did not exist.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::SessionId;

/// The tenant that operators' resources, and every resource made before tenants existed,
/// belong to.
pub const DEFAULT_TENANT: &str = "default";

/// The longest tenant name, in bytes.
pub const MAX_TENANT_BYTES: usize = 128;

/// Whether `name` can be a tenant's name: 1 to 128 bytes of ASCII letters, digits, `-`, `_`
/// and `.` (names appear in URLs, metric labels and log lines).
pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TENANT_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// What a principal may do in its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TenantRole {
    /// Everything in the tenant: keys, agents, vaults, schedules and every session.
    Admin,
    /// Uses the tenant's agents; creates, runs and sees only the sessions it owns.
    Member,
    /// Reads the tenant's agents and sessions.
    Viewer,
}

impl TenantRole {
    pub fn as_str(self) -> &'static str {
        match self {
            TenantRole::Admin => "admin",
            TenantRole::Member => "member",
            TenantRole::Viewer => "viewer",
        }
    }
}

impl fmt::Display for TenantRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TenantRole {
    type Err = String;

    fn from_str(s: &str) -> Result<TenantRole, String> {
        match s {
            "admin" => Ok(TenantRole::Admin),
            "member" => Ok(TenantRole::Member),
            "viewer" => Ok(TenantRole::Viewer),
            other => Err(format!(
                "unknown role {other:?}: one of admin, member, viewer"
            )),
        }
    }
}

/// What a session token lets its bearer do on its one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    /// Its GETs and its event stream.
    Read,
    /// Also runs, cancel, approvals and tool results.
    Interact,
}

impl TokenScope {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Read => "read",
            TokenScope::Interact => "interact",
        }
    }

    pub fn parse(s: &str) -> Option<TokenScope> {
        match s {
            "read" => Some(TokenScope::Read),
            "interact" => Some(TokenScope::Interact),
            _ => None,
        }
    }
}

/// Who makes a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A deployment token (`--api-token`), or any request to a server that requires none:
    /// every tenant.
    Operator,
    /// A key or a JWT's subject: one tenant, in a role.
    Member {
        /// A key's id, or `jwt:<sub>`.
        id: String,
        tenant: String,
        role: TenantRole,
    },
    /// A session token: one session, in a scope, acting for the principal that made it.
    Session {
        session: SessionId,
        scope: TokenScope,
        tenant: String,
        /// The id of the principal that made the token.
        issuer: String,
    },
}

/// The id operators are recorded by (in `answered_by`, and as a session's owner).
pub const OPERATOR_ID: &str = "operator";

/// What a request needs of the session it names (ordered: each includes the ones before).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SessionNeed {
    /// GETs and the event stream.
    Read,
    /// Runs, resume, cancel, approvals, tool results.
    Interact,
    /// Everything else a session's owner does: fork, compact, delete, make tokens.
    Own,
}

/// Why a principal cannot reach a session or a tenant's resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// It cannot see it at all: answered as if it did not exist (`404`).
    Hidden,
    /// It sees it but may not do this (`403`).
    Forbidden,
}

impl Principal {
    /// The id recorded for what this principal does (`answered_by`, a session's `owner`).
    pub fn id(&self) -> &str {
        match self {
            Principal::Operator => OPERATOR_ID,
            Principal::Member { id, .. } => id,
            Principal::Session { issuer, .. } => issuer,
        }
    }

    /// The tenant this principal acts in: `None` for operators, who reach every tenant.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Principal::Operator => None,
            Principal::Member { tenant, .. } | Principal::Session { tenant, .. } => Some(tenant),
        }
    }

    /// The tenant what this principal makes belongs to.
    pub fn home_tenant(&self) -> &str {
        self.tenant().unwrap_or(DEFAULT_TENANT)
    }

    pub fn is_operator(&self) -> bool {
        matches!(self, Principal::Operator)
    }

    /// The role in the tenant (operators count as admins of every tenant).
    pub fn role(&self) -> Option<TenantRole> {
        match self {
            Principal::Operator => Some(TenantRole::Admin),
            Principal::Member { role, .. } => Some(*role),
            Principal::Session { .. } => None,
        }
    }

    /// True for operators and the tenant's admins.
    pub fn is_admin(&self) -> bool {
        self.role() == Some(TenantRole::Admin)
    }

    /// Whether this principal sees what belongs to `tenant`.
    pub fn sees_tenant(&self, tenant: &str) -> bool {
        self.tenant().is_none_or(|own| own == tenant)
    }

    /// Whether it may read the tenant's resources other than sessions (agents, providers,
    /// tools): keys and JWTs of any role, and operators.
    pub fn may_read_tenant(&self) -> Result<(), Denied> {
        match self {
            Principal::Session { .. } => Err(Denied::Forbidden),
            _ => Ok(()),
        }
    }

    /// Whether it may make sessions in its tenant: operators, admins and members.
    pub fn may_create_sessions(&self) -> Result<(), Denied> {
        match self.role() {
            Some(TenantRole::Admin | TenantRole::Member) => Ok(()),
            _ => Err(Denied::Forbidden),
        }
    }

    /// Whether it may manage the tenant (keys, agents, vaults): operators and admins.
    pub fn may_administer(&self) -> Result<(), Denied> {
        match self.is_admin() {
            true => Ok(()),
            false => Err(Denied::Forbidden),
        }
    }

    /// Which sessions of its tenant a list shows it: `Some(owner)` for a member (only its
    /// own), `None` for the others.
    pub fn listed_owner(&self) -> Option<&str> {
        match self {
            Principal::Member {
                id,
                role: TenantRole::Member,
                ..
            } => Some(id),
            _ => None,
        }
    }

    /// Whether this principal may do what `need` asks of the session `id`, which belongs to
    /// `tenant` and was made by `owner`.
    pub fn may_use_session(
        &self,
        id: SessionId,
        tenant: &str,
        owner: Option<&str>,
        need: SessionNeed,
    ) -> Result<(), Denied> {
        match self {
            Principal::Operator => Ok(()),
            Principal::Session {
                session,
                scope,
                tenant: own,
                ..
            } => {
                if *session != id || own != tenant {
                    return Err(Denied::Forbidden);
                }
                let allowed = match scope {
                    TokenScope::Read => SessionNeed::Read,
                    TokenScope::Interact => SessionNeed::Interact,
                };
                match need <= allowed {
                    true => Ok(()),
                    false => Err(Denied::Forbidden),
                }
            }
            Principal::Member {
                id: who,
                tenant: own,
                role,
            } => {
                if own != tenant {
                    return Err(Denied::Hidden);
                }
                match role {
                    TenantRole::Admin => Ok(()),
                    TenantRole::Member if owner == Some(who.as_str()) => Ok(()),
                    TenantRole::Member => Err(Denied::Hidden),
                    TenantRole::Viewer if need == SessionNeed::Read => Ok(()),
                    TenantRole::Viewer => Err(Denied::Forbidden),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, tenant: &str, role: TenantRole) -> Principal {
        Principal::Member {
            id: id.into(),
            tenant: tenant.into(),
            role,
        }
    }

    #[test]
    fn tenants_members_and_viewers_reach_what_the_contract_says() {
        let id = SessionId(super::super::new_id());
        let use_ =
            |p: &Principal, owner: Option<&str>, need| p.may_use_session(id, "a", owner, need);
        assert_eq!(use_(&Principal::Operator, None, SessionNeed::Own), Ok(()));
        let admin = member("k1", "a", TenantRole::Admin);
        assert_eq!(use_(&admin, Some("k2"), SessionNeed::Own), Ok(()));
        let stranger = member("k9", "b", TenantRole::Admin);
        assert_eq!(
            use_(&stranger, Some("k9"), SessionNeed::Read),
            Err(Denied::Hidden)
        );
        let owner = member("k2", "a", TenantRole::Member);
        assert_eq!(use_(&owner, Some("k2"), SessionNeed::Own), Ok(()));
        let other = member("k3", "a", TenantRole::Member);
        assert_eq!(
            use_(&other, Some("k2"), SessionNeed::Read),
            Err(Denied::Hidden)
        );
        let viewer = member("k4", "a", TenantRole::Viewer);
        assert_eq!(use_(&viewer, Some("k2"), SessionNeed::Read), Ok(()));
        assert_eq!(
            use_(&viewer, Some("k2"), SessionNeed::Interact),
            Err(Denied::Forbidden)
        );
        assert_eq!(owner.listed_owner(), Some("k2"));
        assert_eq!(admin.listed_owner(), None);
        assert_eq!(viewer.may_create_sessions(), Err(Denied::Forbidden));
        assert_eq!(owner.may_administer(), Err(Denied::Forbidden));
    }

    #[test]
    fn a_session_token_reaches_its_session_in_its_scope_only() {
        let id = SessionId(super::super::new_id());
        let token = |scope| Principal::Session {
            session: id,
            scope,
            tenant: "a".into(),
            issuer: "k2".into(),
        };
        let read = token(TokenScope::Read);
        assert_eq!(
            read.may_use_session(id, "a", None, SessionNeed::Read),
            Ok(())
        );
        assert_eq!(
            read.may_use_session(id, "a", None, SessionNeed::Interact),
            Err(Denied::Forbidden)
        );
        let interact = token(TokenScope::Interact);
        assert_eq!(
            interact.may_use_session(id, "a", None, SessionNeed::Interact),
            Ok(())
        );
        assert_eq!(
            interact.may_use_session(id, "a", None, SessionNeed::Own),
            Err(Denied::Forbidden)
        );
        assert_eq!(
            interact.may_use_session(
                SessionId(super::super::new_id()),
                "a",
                None,
                SessionNeed::Read
            ),
            Err(Denied::Forbidden)
        );
        assert_eq!(interact.may_read_tenant(), Err(Denied::Forbidden));
        assert_eq!(interact.id(), "k2");
    }

    #[test]
    fn tenant_names_are_short_and_plain() {
        assert!(valid_tenant("acme-1.prod_eu"));
        for bad in ["", "a b", "a/b", "é", &"x".repeat(129)] {
            assert!(!valid_tenant(bad), "{bad}");
        }
    }
}
