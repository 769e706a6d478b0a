//! Query-string values as clients send them: a boolean may be spelled the way any HTTP client
//! library spells it (`true`, `True` from Python's `requests`, `1`, `yes`…). Query strings are
//! strict: each route's query type refuses the parameters it does not take.

use serde::{Deserialize, Deserializer};

/// The query of a route that takes no parameters: any parameter is a `400`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

/// `true/false`, `1/0`, `yes/no`, `on/off`, in any case.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Deserialises an optional boolean query parameter with [`parse_bool`].
pub fn lenient_bool<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<bool>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    text.map(|t| {
        parse_bool(&t).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{t:?} is not a boolean (use true or false, 1 or 0, yes or no)"
            ))
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usual_spellings_are_booleans() {
        for yes in ["true", "True", "TRUE", "1", "yes", "Yes", "on"] {
            assert_eq!(parse_bool(yes), Some(true), "{yes}");
        }
        for no in ["false", "False", "0", "no", "NO", "off"] {
            assert_eq!(parse_bool(no), Some(false), "{no}");
        }
        for neither in ["", "2", "maybe", "truee"] {
            assert_eq!(parse_bool(neither), None, "{neither}");
        }
    }

    #[derive(Debug, Deserialize)]
    struct Query {
        #[serde(default, deserialize_with = "lenient_bool")]
        wait: Option<bool>,
    }

    #[test]
    fn a_route_without_parameters_refuses_any() {
        assert!(serde_urlencoded::from_str::<NoQuery>("").is_ok());
        let error = serde_urlencoded::from_str::<NoQuery>("limit=5").unwrap_err();
        assert!(error.to_string().contains("limit"), "{error}");
    }

    #[test]
    fn a_query_flag_accepts_them_and_refuses_anything_else() {
        let q: Query = serde_urlencoded::from_str("wait=True").unwrap();
        assert_eq!(q.wait, Some(true));
        let q: Query = serde_urlencoded::from_str("").unwrap();
        assert_eq!(q.wait, None);
        let error = serde_urlencoded::from_str::<Query>("wait=maybe").unwrap_err();
        assert!(error.to_string().contains("not a boolean"), "{error}");
    }
}
