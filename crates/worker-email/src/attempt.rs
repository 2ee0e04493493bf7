//! One attempt at one provider, as every transport sees it: the message it sends
//! ([`Outgoing`]) and what its answer says about the provider ([`Verdict`]), which the
//! provider choice ([`crate::providers`]) acts on.

use serde_json::Value;

/// What an answer says about the provider, for its breaker and the choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The provider answered (accepted, or refused permanently): breaker success, final.
    Answered,
    /// Transient failure and nothing was accepted: breaker failure, try the next provider.
    FailOver,
    /// Transient failure after which the message may have been accepted: breaker failure,
    /// final (a retry per policy).
    Ambiguous,
    /// The call ended before telling anything about the provider (lease lost): final.
    Neutral,
}

impl Verdict {
    /// The `outcome` label of `notify_email_provider_attempts_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::FailOver => "failed_over",
            Self::Ambiguous => "ambiguous",
            Self::Neutral => "interrupted",
        }
    }
}

/// The message of one attempt, as every transport needs it.
pub struct Outgoing<'a> {
    /// Envelope sender.
    pub from: Option<lettre::Address>,
    /// Envelope recipients.
    pub to: &'a [lettre::Address],
    /// The formatted MIME message.
    pub bytes: &'a [u8],
    /// The attempt's recorded content (the provider's name is added).
    pub content: &'a Value,
    /// The stable Message-ID.
    pub message_id: String,
}
