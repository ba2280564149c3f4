//! Config sections a driver declares in its own file ([`Section::of`], returned by its `Driver::section`): a new
//! kind's section is no line here nor in [`super::DriverConfig`], and this module still imports no driver. The
//! `--config` file's top-level keys are the struct's fields and the declared sections; the file is read with
//! the declared ones ([`super::DriverConfig::from_yaml_declaring`]), any other key refused as before. A driver
//! reads its section with [`super::DriverConfig::section`].

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use super::ConfigError;

/// A section's own rules, checked when the file is read.
pub trait SectionConfig: DeserializeOwned + Send + Sync + 'static {
    /// Checks the values (paths, argv, templates); the error names the key below the section.
    fn validate(&self) -> Result<(), String>;
}

/// One top-level key of the `--config` file a driver declares, and how to read it.
#[derive(Clone, Copy)]
pub struct Section {
    /// The key (camelCase, as in the YAML).
    pub key: &'static str,
    parse: fn(serde_yaml_ng::Value) -> Result<Parsed, ConfigError>,
}

type Parsed = Arc<dyn Any + Send + Sync>;

impl Section {
    /// The section `key`, read as a `T` (unknown keys inside it refused when `T` denies them) and checked.
    pub const fn of<T: SectionConfig>(key: &'static str) -> Section {
        Section {
            key,
            parse: parse::<T>,
        }
    }
}

fn parse<T: SectionConfig>(value: serde_yaml_ng::Value) -> Result<Parsed, ConfigError> {
    let section: T =
        serde_yaml_ng::from_value(value).map_err(|e| ConfigError::Parse(e.to_string()))?;
    section.validate().map_err(ConfigError::Invalid)?;
    Ok(Arc::new(section))
}

/// The file's keys that are not [`super::DriverConfig`] fields, until read as the declared sections.
#[derive(Clone, Default)]
pub struct Sections {
    /// The other keys as the file holds them (empty once [`Sections::declare`] read them).
    raw: BTreeMap<String, serde_yaml_ng::Value>,
    /// The declared sections the file holds, read and checked.
    parsed: BTreeMap<&'static str, Parsed>,
}

impl Sections {
    /// Reads every other key as the section of `declared` it names; a key no section declares is refused as
    /// serde refuses a struct's unknown field.
    pub(super) fn declare(&mut self, declared: &[Section]) -> Result<(), ConfigError> {
        for (key, value) in std::mem::take(&mut self.raw) {
            let Some(section) = declared.iter().find(|section| section.key == key) else {
                return Err(ConfigError::Parse(format!(
                    "unknown field `{key}`: neither a key of the agent config nor a section a driver declares"
                )));
            };
            let parsed = (section.parse)(value).map_err(|e| match e {
                ConfigError::Invalid(e) => ConfigError::Invalid(format!("{key}: {e}")),
                e => ConfigError::Parse(format!("{key}: {}", message(&e))),
            })?;
            self.parsed.insert(section.key, parsed);
        }
        Ok(())
    }

    /// The section `key` as a `T`, when the file has it (`None` also when `T` is not its type).
    pub fn get<T: SectionConfig>(&self, key: &str) -> Option<&T> {
        self.parsed.get(key)?.downcast_ref()
    }
}

/// A section's error without the `agent config: ` its display starts with.
fn message(e: &ConfigError) -> String {
    match e {
        ConfigError::Parse(text) | ConfigError::Invalid(text) => text.clone(),
        other => other.to_string(),
    }
}

impl fmt::Debug for Sections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(
                self.raw
                    .keys()
                    .map(String::as_str)
                    .chain(self.parsed.keys().copied()),
            )
            .finish()
    }
}

/// Every key the struct's fields leave, as it is: flattened into [`super::DriverConfig`].
impl<'de> Deserialize<'de> for Sections {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Sections {
            raw: BTreeMap::deserialize(deserializer)?,
            parsed: BTreeMap::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::DriverConfig;

    /// A section as a driver would declare it, in test builds only.
    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Greeting {
        path: String,
    }

    impl SectionConfig for Greeting {
        fn validate(&self) -> Result<(), String> {
            if self.path.starts_with('/') {
                Ok(())
            } else {
                Err(format!("path: {:?} is not absolute", self.path))
            }
        }
    }

    const GREETING: Section = Section::of::<Greeting>("greeting");

    fn from_yaml(text: &str) -> Result<DriverConfig, ConfigError> {
        DriverConfig::from_yaml_declaring(text, &[GREETING])
    }

    #[test]
    fn a_declared_section_is_read_with_the_file_and_checked() {
        let config = from_yaml("path: [/bin]\ngreeting: {path: /etc/motd}\n").unwrap();
        let greeting: &Greeting = config.section("greeting").unwrap();
        assert_eq!(greeting.path, "/etc/motd");
        assert_eq!(config.path, ["/bin"]);
        assert!(
            from_yaml("{}")
                .unwrap()
                .section::<Greeting>("greeting")
                .is_none()
        );
        let err = |text: &str| from_yaml(text).unwrap_err().to_string();
        assert!(
            err("greeting: {paht: /x}\n").contains("greeting: unknown field `paht`"),
            "{}",
            err("greeting: {paht: /x}\n")
        );
        assert!(
            err("greeting: {path: motd}\n").contains("greeting: path: \"motd\" is not absolute"),
            "{}",
            err("greeting: {path: motd}\n")
        );
        // The file's other keys are still the struct's, typos refused.
        assert!(err("greting: {path: /x}\n").contains("unknown field `greting`"));
        assert!(err("kubelet: {flagsFil: /x}\n").contains("unknown field `flagsFil`"));
    }
}
