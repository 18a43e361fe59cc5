//! Secret references: how a phase names a secret it must never see.
//!
//! # Background
//! A component that holds the token can send it anywhere its grants reach (a URL, a log line,
//! another file). So the host never hands a secret to a phase: in the config a phase receives,
//! the bootstrap token is the fixed string [`BOOTSTRAP_TOKEN_REF`]. The file the token belongs
//! in, the bootstrap kubeconfig, the host renders itself (the phase input's
//! `bootstrapKubeconfig` names it). A bundle built for an earlier agent still has its phase
//! write the reference where the token belongs, and the host substitutes the value while
//! writing a file the phase's `secrets` grant names (mode without group/other bits only).
//!
//! # Guarantees
//! - A reference is a fixed, public string: it carries no information about the value.
//! - [`NodeConfig::with_secret_references`] replaces every secret of the document, so what it
//!   returns can be given to any phase.

use crate::{InvalidField, NodeConfig, Secret, invalid, is_bootstrap_token};

/// What the bootstrap token is replaced by in a phase's input, and what a phase writes where
/// the token belongs.
pub const BOOTSTRAP_TOKEN_REF: &str = "nodeward-secret:bootstrap-token";

/// The name of the bootstrap token in a bundle's `secrets` grant (`bootstrap-token = [...]`).
pub const BOOTSTRAP_TOKEN: &str = "bootstrap-token";

/// Which form the secrets of a config must have when it is validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretForm {
    /// Real values: the operator's document, on the host.
    Value,
    /// References: the config inside a phase's input.
    Reference,
}

/// Checks the bootstrap token's form: a real token, or exactly the reference.
pub(crate) fn check_token(form: SecretForm, token: &str) -> Result<(), InvalidField> {
    match form {
        SecretForm::Value if !is_bootstrap_token(token) => Err(invalid(
            "kubelet.auth.bootstrapToken",
            "must match [a-z0-9]{6}.[a-z0-9]{16}",
        )),
        SecretForm::Reference if token != BOOTSTRAP_TOKEN_REF => Err(invalid(
            "kubelet.auth.bootstrapToken",
            format!(
                "must be the reference {BOOTSTRAP_TOKEN_REF:?} in a phase's input (the host substitutes the value)"
            ),
        )),
        _ => Ok(()),
    }
}

impl NodeConfig {
    /// [`NodeConfig::validate`] for the config a phase receives, in which the host has
    /// replaced every secret by its reference ([`NodeConfig::with_secret_references`]): the
    /// bootstrap token must be exactly [`BOOTSTRAP_TOKEN_REF`].
    pub fn validate_phase_view(&self) -> Result<(), InvalidField> {
        self.validate_with(SecretForm::Reference)
    }

    /// This config with every secret replaced by its reference: the only form a phase sees.
    pub fn with_secret_references(&self) -> NodeConfig {
        let mut c = self.clone();
        c.kubelet.auth.bootstrap_token = Secret::new(BOOTSTRAP_TOKEN_REF);
        c
    }

    /// Each secret of this document as (name, reference, value), for the host's substitution.
    pub fn secret_values(&self) -> Vec<(&'static str, &'static str, String)> {
        vec![(
            BOOTSTRAP_TOKEN,
            BOOTSTRAP_TOKEN_REF,
            self.kubelet.auth.bootstrap_token.expose().to_string(),
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeConfig {
        serde_json::from_str(
            r#"{"apiVersion":"nodeward.io/v1alpha1","kind":"NodeConfig","machineName":"w",
            "cluster":{"apiServer":"https://10.0.0.1:6443",
              "caCertData":"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=",
              "kubernetesVersion":"1.34.1"},
            "kubelet":{"auth":{"bootstrapToken":"abcdef.0123456789abcdef"}}}"#,
        )
        .expect("sample config")
    }

    #[test]
    fn a_phase_view_holds_only_the_reference_and_validates_only_as_one() {
        let c = sample();
        c.validate().expect("the operator's config is valid");
        let view = c.with_secret_references();
        let json = serde_json::to_string(&view).expect("json");
        assert!(!json.contains("0123456789abcdef"), "{json}");
        assert!(json.contains(BOOTSTRAP_TOKEN_REF));
        view.validate_phase_view().expect("a phase's view is valid");
        assert_eq!(
            view.validate().expect_err("a reference is no token").field,
            "kubelet.auth.bootstrapToken"
        );
        assert_eq!(
            c.validate_phase_view()
                .expect_err("a phase never gets the value")
                .field,
            "kubelet.auth.bootstrapToken"
        );
        assert_eq!(
            c.secret_values(),
            vec![(
                BOOTSTRAP_TOKEN,
                BOOTSTRAP_TOKEN_REF,
                "abcdef.0123456789abcdef".to_string()
            )]
        );
    }
}
