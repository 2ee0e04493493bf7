//! Closed sets of names stored as text (a delivery's status, a type's priority ...): one
//! macro gives each its `as_str`, `Display`, `FromStr` and serde forms, so the text of a
//! value is written once, next to its variant.

/// The text is not one of the names of a closed set. Carries what was being read, the
/// text found and the names allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {value:?}: expected one of {}", expected.join(", "))]
pub struct UnknownValue {
    /// What was being read, e.g. `priority`.
    pub kind: &'static str,
    /// The text found.
    pub value: String,
    /// The names allowed.
    pub expected: &'static [&'static str],
}

/// Defines a `Copy` enum whose variants are named by fixed lowercase texts, with
/// `ALL`, `NAMES`, `as_str`, `Display`, `FromStr` (exact match, error [`UnknownValue`])
/// and serde as that text. Used as
/// `named_enum! { /// docs \n pub enum Priority("priority") { /// docs \n Low = "low", } }`.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident($kind:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The stored name of every value, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// Canonical lowercase name, as stored in the database and shown in the API.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::named::UnknownValue;

            /// Exactly one of the canonical names (no case folding, no trimming).
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $text => Ok($name::$variant), )+
                    _ => Err($crate::named::UnknownValue {
                        kind: $kind,
                        value: s.to_string(),
                        expected: $name::NAMES,
                    }),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use named_enum;
