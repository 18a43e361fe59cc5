//! Reserved units under another name: aliases, and the links an `[Install]` section makes.
//!
//! # Background
//! systemd loads a unit file that is a symlink to another unit's file as an alias of that unit
//! (systemd.unit(5), "aliases"): with `etc/systemd/system/helper.service -> nodeward.service`
//! left in a unit directory by anyone, `stop helper.service` stops the agent, so checking the
//! name a phase gives against [`crate::reserved::RESERVED_UNITS`] is not enough. And `enable`
//! makes the links a unit's `[Install]` section names: `Alias=nodeward.service` puts a link
//! named after the agent's unit in `etc/systemd/system` (shadowing a unit file in `usr/lib`),
//! `WantedBy=`/`RequiredBy=`/`UpheldBy=nodeward.service` give the agent a dependency, and
//! `Also=nodeward.service` enables or disables the agent along with the unit.
//!
//! # Guarantees
//! - A verb other than `status` on a unit whose file, in any unit directory of the run
//!   ([`crate::reserved::Reserved::unit_dirs`]), is a symlink whose chain passes the name of a
//!   reserved unit is `denied`, naming the link.
//! - `enable` and `disable` of a unit whose `[Install]` section names a reserved unit are
//!   `denied`, naming the file and the setting. Read as systemctl reads it: the unit file,
//!   followed through links, and its `.conf` drop-ins (a drop-in that is a link followed,
//!   beneath the root) in every unit directory; for a template instance (`foo@x.service`)
//!   the template's file and drop-ins (`foo@.service`, `foo@.service.d`) too.
//! - systemd expands specifiers (`%i`, `%n`, `%p`, ...) in `Alias=`, `Also=`, `WantedBy=`,
//!   `RequiredBy=` and `UpheldBy=`, so `Alias=%p.service` of `nodeward@.service` names the
//!   agent's unit. Rather than expand them as systemd would, a value there holding `%` is
//!   refused like one naming a reserved unit (the simple rule that cannot be wrong).
//! - Both read through the run's file layer, so a plan sees the files it planned; the unit
//!   files are read for the host's parsing only ([`crate::rootfs::RootFs::read_for_host`]),
//!   so an OSTree host's unit files, hard links into its repository, are read too.
//!
//! # Caveats
//! A unit's other settings (`Conflicts=nodeward.service` in `[Unit]`, an `ExecStart=` that
//! runs `systemctl`) act on the agent too: a phase that may write a unit and start or enable
//! it is root-equivalent, as `docs/bundle-format.md` tells auditors.

use super::{Error, PhaseCtx, UnitName};
use crate::hostpath::HostPath;
use crate::reserved::{AGENT_UNIT, is_reserved_unit};
use crate::rootfs::{Check, EntryKind, Final, MAX_LINKS, RootFs, link_destination};

/// The `[Install]` settings that link a unit under another unit's name or enable another unit
/// (systemd.unit(5)): naming any reserved unit is refused (`Alias=default.target` would make
/// the unit the boot target).
const NAMING_SETTINGS: &[&str] = &["Alias", "Also"];

/// The `[Install]` settings that add the unit to another unit's dependencies: naming the
/// agent's unit is refused (`WantedBy=multi-user.target` is how units start at boot).
const DEPENDENCY_SETTINGS: &[&str] = &["WantedBy", "RequiredBy", "UpheldBy"];

/// The first `[Install]` setting of `text` (a unit file or drop-in) that would link a reserved
/// unit, or holds a specifier (`%`) that systemd would expand into a name, as `Setting=unit`.
/// Continuation lines are joined first, as systemd reads them.
pub fn install_names_reserved(text: &str) -> Option<String> {
    let joined = text.replace("\\\n", " ");
    let mut install = false;
    for line in joined.lines().map(str::trim) {
        if line.starts_with('[') {
            install = line == "[Install]";
            continue;
        }
        let Some((key, values)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let refused = |u: &&str| {
            let linking = NAMING_SETTINGS.contains(&key) || DEPENDENCY_SETTINGS.contains(&key);
            if linking && u.contains('%') {
                true
            } else if NAMING_SETTINGS.contains(&key) {
                is_reserved_unit(u)
            } else {
                DEPENDENCY_SETTINGS.contains(&key) && u.eq_ignore_ascii_case(AGENT_UNIT)
            }
        };
        if !install {
            continue;
        }
        if let Some(unit) = values.split_whitespace().find(refused) {
            return Some(format!("{key}={unit}"));
        }
    }
    None
}

/// The template of a template instance (`foo@.service` for `foo@x.service`), whose file and
/// drop-ins systemctl reads for the instance; `None` for any other unit.
fn template_of(unit: &str) -> Option<String> {
    let (prefix, rest) = unit.split_once('@')?;
    let (instance, kind) = rest.rsplit_once('.')?;
    (!instance.is_empty()).then(|| format!("{prefix}@.{kind}"))
}

/// Where `path` leads beneath the root, its links (absolute ones taken from the root, as in
/// the alias check) followed, at most [`MAX_LINKS`] of them: the file systemd reads there.
fn follow(files: &RootFs, path: &HostPath, check: &Check) -> Result<HostPath, Error> {
    let mut at = files.resolve(path, Final::NoFollow, check)?;
    for _ in 0..MAX_LINKS {
        if files.lstat(&at)?.map(|st| st.kind) != Some(EntryKind::Symlink) {
            break;
        }
        let target = files.read_link(&at)?;
        match link_destination(&at, &target)? {
            Some(next) => at = files.resolve(&next, Final::NoFollow, check)?,
            None => break,
        }
    }
    Ok(at)
}

impl PhaseCtx {
    /// `denied` when `unit` is a reserved unit under another name: its file in a unit
    /// directory is a link to one; and, for `enable`/`disable` (`install`), when its
    /// `[Install]` section names one (see the module docs).
    pub(super) fn not_a_reserved_unit_by_another_name(
        &self,
        unit: &UnitName,
        install: bool,
    ) -> Result<(), Error> {
        let files = &self.run.files;
        let anywhere = |_: &HostPath| true;
        let check = Check {
            verb: "look up",
            grant: "systemd",
            covers: &anywhere,
            deadline: self.deadline,
        };
        let invalid = |e: crate::hostpath::InvalidPath| Error::InvalidArgument(e.to_string());
        for dir in self.run.reserved.unit_dirs() {
            let mut at = files.resolve(
                &dir.join(unit.as_str()).map_err(invalid)?,
                Final::NoFollow,
                &check,
            )?;
            for _ in 0..MAX_LINKS {
                if files.lstat(&at)?.map(|st| st.kind) != Some(EntryKind::Symlink) {
                    break;
                }
                let target = files.read_link(&at)?;
                let name = target.rsplit('/').next().unwrap_or_default();
                if is_reserved_unit(name) {
                    return Err(Error::Denied(format!(
                        "{unit}: {at} -> {target:?} makes it an alias of {name}, which is \
                         reserved to the agent (no grant covers it)"
                    )));
                }
                match link_destination(&at, &target)? {
                    Some(next) => at = files.resolve(&next, Final::NoFollow, &check)?,
                    None => break,
                }
            }
            if !install {
                continue;
            }
            let mut sources = vec![at];
            let template = template_of(unit.as_str());
            if let Some(t) = &template {
                sources.push(follow(files, &dir.join(t).map_err(invalid)?, &check)?);
            }
            for name in std::iter::once(unit.as_str()).chain(template.as_deref()) {
                let drop_ins = dir
                    .join(&format!("{name}.d"))
                    .map_err(invalid)
                    .and_then(|d| files.resolve(&d, Final::Follow, &check))?;
                if !files.is_dir(&drop_ins)? {
                    continue;
                }
                for (conf, kind) in files.list(&drop_ins)? {
                    if matches!(kind, EntryKind::File | EntryKind::Symlink)
                        && conf.ends_with(".conf")
                    {
                        // systemd follows a drop-in that is a link; so does the guard, beneath
                        // the root.
                        sources.push(follow(
                            files,
                            &drop_ins.join(&conf).map_err(invalid)?,
                            &check,
                        )?);
                    }
                }
            }
            for source in sources {
                if files.lstat(&source)?.map(|st| st.kind) != Some(EntryKind::File) {
                    continue;
                }
                let text = files.read_for_host(&source)?;
                if let Some(setting) = install_names_reserved(&String::from_utf8_lossy(&text)) {
                    return Err(Error::Denied(format!(
                        "{unit}: {source} sets {setting} in [Install], which would link a unit \
                         reserved to the agent, or could once its specifiers are expanded (no \
                         grant covers it)"
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_settings_naming_a_reserved_unit_are_found() {
        for (text, found) in [
            (
                "[Install]\nAlias=nodeward.service\n",
                Some("Alias=nodeward.service"),
            ),
            (
                "[Install]\nWantedBy=multi-user.target nodeward.service\n",
                Some("WantedBy=nodeward.service"),
            ),
            (
                "[Install]\nWantedBy=multi-user.target\nAlias=kubelet2.service\n",
                None,
            ),
            (
                "[Install]\nAlias=default.target\n",
                Some("Alias=default.target"),
            ),
            (
                "[Install]\nAlso=a.service \\\n  nodeward.service\n",
                Some("Also=nodeward.service"),
            ),
            (
                "[Install]\n RequiredBy = NODEWARD.service\n",
                Some("RequiredBy=NODEWARD.service"),
            ),
            (
                "[Unit]\nAlias=nodeward.service\n[Install]\nWantedBy=kubelet.service\n",
                None,
            ),
            (
                "[Install]\nWantedBy=kubelet.service\n# Alias=nodeward.service\n",
                None,
            ),
            ("[Service]\nExecStart=/bin/true\n", None),
            ("[Install]\nAlias=%p.service\n", Some("Alias=%p.service")),
            (
                "[Install]\nWantedBy=multi-user.target %i.service\n",
                Some("WantedBy=%i.service"),
            ),
            ("[Install]\nAlso=x%n\n", Some("Also=x%n")),
            ("[Service]\nExecStart=/bin/echo %i\n", None),
        ] {
            assert_eq!(install_names_reserved(text).as_deref(), found, "{text}");
        }
    }

    #[test]
    fn a_template_instance_reads_its_template() {
        assert_eq!(
            template_of("foo@x.service").as_deref(),
            Some("foo@.service")
        );
        assert_eq!(
            template_of("foo@a.b.service").as_deref(),
            Some("foo@.service")
        );
        assert_eq!(template_of("foo@.service"), None);
        assert_eq!(template_of("foo.service"), None);
    }
}
