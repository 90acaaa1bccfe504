//! The provider's resource arithmetic (spec §6, §7.3), on top of Mesos's `Resources`:
//! [`ProviderResources`], the context every resource of this provider is built from, with
//! raw disk resources (§6.1), storage pools (§6.2), existing volumes (§6.3),
//! `computeConversion` (§6.4), reconciliation (§6.5) and the conversions of finished
//! CREATE_DISK and DESTROY_DISK; and the profile-set arithmetic of §7.3.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use slrp_csi::Volume;
use slrp_proto::mesos::v1::resource::disk_info::Source;
use slrp_proto::mesos::v1::resource::disk_info::source::{Mount, Type as SourceType};
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_proto::mesos::v1::resource::{DiskInfo, ReservationInfo};
use slrp_proto::mesos::v1::value::{Scalar, Type as ValueType};
use slrp_proto::mesos::v1::{Labels, Resource, ResourceProviderId};

use super::ResourceError;
use super::algebra::{Conversion, Resources};
use super::resource::{
    disk_id, disk_profile, is_empty, is_storage_pool, kind_key, labels_eq, labels_from_context,
    resource_eq, source, source_mut,
};

/// Bytes in one Mesos megabyte: disk scalars are MB as a double.
const BYTES_PER_MB: f64 = 1_048_576.0;

// ---------------------------------------------------------------------------------------
// The provider context.

/// What every provider resource is built from (spec §6.1, §6.7, §6.8).
#[derive(Debug, Clone)]
pub struct ProviderResources {
    provider_id: ResourceProviderId,
    vendor: String,
    default_reservations: Vec<ReservationInfo>,
    mount_root: String,
}

impl ProviderResources {
    /// The context of the provider `provider_id` serving plugin `plugin_type`/`plugin_name`
    /// with `default_reservations` (`ResourceProviderInfo.default_reservations`).
    ///
    /// # Errors
    /// - [`ResourceError::BadPluginName`]: the plugin type or name is empty, `.`, `..` or
    ///   holds a `/` or NUL (it becomes a directory of the MOUNT root; Mesos does not
    ///   check, see spec §12).
    /// - [`ResourceError::BadReservation`]: the stack is not "first STATIC or DYNAMIC, the
    ///   rest DYNAMIC, each role a child of the one below" (§6.7; Mesos validates this when
    ///   the config is read).
    pub fn new(
        provider_id: ResourceProviderId,
        plugin_type: &str,
        plugin_name: &str,
        default_reservations: Vec<ReservationInfo>,
    ) -> Result<Self, ResourceError> {
        for (field, value) in [("type", plugin_type), ("name", plugin_name)] {
            if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
                return Err(ResourceError::BadPluginName {
                    field,
                    value: value.to_owned(),
                });
            }
        }
        validate_reservations(&default_reservations)?;
        Ok(Self {
            provider_id,
            vendor: format!("{plugin_type}.{plugin_name}"),
            default_reservations,
            mount_root: format!("./csi/{plugin_type}/{plugin_name}/mounts"),
        })
    }

    /// `<plugin type>.<plugin name>`, the `disk.source.vendor` of every resource.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The provider id every resource carries.
    pub fn provider_id(&self) -> &ResourceProviderId {
        &self.provider_id
    }

    /// The default reservation stack.
    pub fn default_reservations(&self) -> &[ReservationInfo] {
        &self.default_reservations
    }

    /// `./csi/<plugin type>/<plugin name>/mounts`: the `mount.root` of MOUNT disks,
    /// relative to the agent's work dir (§6.8; Mesos `csi::paths::getMountRootDir` on
    /// `getCsiRootDir(".")`).
    pub fn mount_root(&self) -> &str {
        &self.mount_root
    }

    /// The `disk.source.mount` a MOUNT disk of this provider carries.
    pub fn mount_source(&self) -> Mount {
        Mount {
            root: Some(self.mount_root.clone()),
        }
    }

    /// Mesos `createRawDiskResource` with the provider's vendor (§6.1): `bytes` as MB
    /// (not rounded), the provider id, the default reservations verbatim, a RAW source.
    pub fn raw_disk(
        &self,
        bytes: u64,
        profile: Option<&str>,
        id: Option<&str>,
        metadata: Option<Labels>,
    ) -> Resource {
        self.raw_disk_mb(
            bytes as f64 / BYTES_PER_MB,
            profile,
            Some(&self.vendor),
            id,
            metadata,
        )
    }

    fn raw_disk_mb(
        &self,
        megabytes: f64,
        profile: Option<&str>,
        vendor: Option<&str>,
        id: Option<&str>,
        metadata: Option<Labels>,
    ) -> Resource {
        Resource {
            provider_id: Some(self.provider_id.clone()),
            name: "disk".to_owned(),
            r#type: ValueType::Scalar as i32,
            scalar: Some(Scalar { value: megabytes }),
            role: None,
            reservations: self.default_reservations.clone(),
            disk: Some(DiskInfo {
                persistence: None,
                volume: None,
                source: Some(Source {
                    r#type: SourceType::Raw as i32,
                    path: None,
                    mount: None,
                    vendor: vendor.map(str::to_owned),
                    id: id.map(str::to_owned),
                    metadata,
                    profile: profile.map(str::to_owned),
                }),
            }),
            ..Resource::default()
        }
    }

    /// Storage pools from GetCapacity answers (§6.2, Mesos `getStoragePools`): one RAW
    /// resource per `(profile, available bytes)`, without id or metadata; zero capacities
    /// are dropped.
    pub fn storage_pools<'a>(
        &self,
        capacities: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Resources {
        capacities
            .into_iter()
            .map(|(profile, bytes)| self.raw_disk(bytes, Some(profile), None, None))
            .collect()
    }

    /// Mesos `computeConversion(checkpointed, discovered)` (§6.4): keep what frameworks
    /// converted, drop untouched resources the plugin no longer reports, add newly
    /// reported ones.
    ///
    /// For each checkpointed resource its "unconverted" form (a fresh RAW disk of the same
    /// size, profile, vendor, id and metadata with the *current* default reservations) is
    /// looked up in what is left of `discovered`: found, it is not new; not found and the
    /// checkpointed resource is unconverted, it is removed; otherwise it is kept and
    /// reported in [`ComputedConversion::missing_converted`] (Mesos logs "Missing converted
    /// resource").
    ///
    /// Difference: Mesos rebuilds the size through `Bytes(mb × 1048576)` (truncating to
    /// whole bytes); this keeps the MB value, which compares equal at the 0.001 MB
    /// granularity of every comparison involved.
    pub fn compute_conversion(
        &self,
        checkpointed: &Resources,
        discovered: &Resources,
    ) -> ComputedConversion {
        self.compute_conversion_from(checkpointed, discovered.clone())
    }

    /// [`Self::compute_conversion`] taking `discovered`: a caller that built it for this
    /// saves a copy of a collection as large as the total.
    fn compute_conversion_from<'a>(
        &self,
        checkpointed: impl IntoIterator<Item = &'a Resource>,
        discovered: Resources,
    ) -> ComputedConversion {
        let mut to_add = discovered;
        let mut to_remove = Resources::new();
        let mut missing_converted = Vec::new();
        for resource in checkpointed {
            let unconverted = Resources::from(self.unconverted(resource));
            if to_add.contains(&unconverted) {
                to_add = to_add - &unconverted;
            } else if unconverted == Resources::from(resource.clone()) {
                to_remove = to_remove + &unconverted;
            } else {
                missing_converted.push(resource.clone());
            }
        }
        ComputedConversion {
            conversion: Conversion {
                consumed: to_remove,
                converted: to_add,
            },
            missing_converted,
        }
    }

    /// The "unconverted" form of `resource` (Mesos `computeConversion`): a fresh RAW disk
    /// of the same size, profile, vendor, id and metadata with the *current* default
    /// reservations, as the plugin's answers would make it.
    fn unconverted(&self, resource: &Resource) -> Resource {
        let source = source(resource);
        let field = |get: fn(&Source) -> Option<&String>| source.and_then(get);
        self.raw_disk_mb(
            resource.scalar.map_or(0.0, |s| s.value),
            field(|s| s.profile.as_ref()).map(String::as_str),
            field(|s| s.vendor.as_ref()).map(String::as_str),
            field(|s| s.id.as_ref()).map(String::as_str),
            source.and_then(|s| s.metadata.clone()),
        )
    }

    /// The pool part of a reconciliation (§6.2, Mesos `getStoragePools`), with pending
    /// creates taken into account.
    ///
    /// `in_flight` is what pending CREATE_DISK operations consume (RAW pool resources the
    /// total still holds until they finish). Difference from Mesos: both the checkpointed
    /// pools and the GetCapacity answers have `in_flight` taken out before
    /// [`compute_conversion`](Self::compute_conversion), so (a) the conversion never
    /// removes space a pending operation consumes (in Mesos a plugin that shrinks its
    /// capacity while a create runs can leave the total without the operation's consumed
    /// resources, and applying its result then aborts), and (b) the capacity reported to
    /// the manager excludes volumes still being created whether or not the plugin's
    /// GetCapacity already counts them. A plugin that already counts them is
    /// under-reported until the next reconciliation after the create finishes; space is
    /// never offered twice.
    ///
    /// The in-flight part is taken out of the checkpointed pools as it is (it is in the
    /// total with its reservations) but out of the answers in its unconverted form: the
    /// answers are fresh RAW disks with the default reservations, from which a RESERVEd
    /// part (or one of a provider whose default reservations changed) would subtract
    /// nothing, and its space would be offered twice.
    pub fn reconcile_pools(
        &self,
        total: &Resources,
        discovered: &Resources,
        in_flight: &Resources,
    ) -> ComputedConversion {
        let checkpointed = total.filter(is_storage_pool) - in_flight;
        let claimed: Resources = in_flight.iter().map(|r| self.unconverted(r)).collect();
        self.compute_conversion_from(&checkpointed, discovered.clone() - &claimed)
    }

    /// The volume part of a reconciliation (§6.3, Mesos `getExistingVolumes`) from a
    /// ListVolumes answer.
    ///
    /// 1. Resources of `total` with an id already seen are duplicates (a non-conforming
    ///    plugin) and are removed.
    /// 2. Each listed volume becomes a RAW disk with the vendor, its id, capacity and
    ///    context as metadata (none if empty) and the profile of the checkpointed
    ///    resource with that id; a repeated id in the listing is ignored after the first.
    ///    Difference: a volume with a checkpointed resource (and a listed size) takes that
    ///    resource's size, so a plugin whose sizes differ from the requested ones (spec
    ///    §12 item 28) does not make a second resource of the same volume.
    /// 3. A checkpointed resource whose metadata differs from the listed context is
    ///    replaced by a copy with the listed metadata (its conversions kept).
    /// 4. [`compute_conversion`](Self::compute_conversion) over the resources with an id
    ///    after step 1 and 3.
    ///
    /// As in Mesos, a volume listed with capacity 0 (unknown) makes an empty resource and
    /// is therefore not discovered; a negative capacity counts as 0.
    ///
    /// # Errors
    /// [`ResourceError::NotContained`] if the cleanup does not apply to `total`, which
    /// only a `total` holding mergeable disks with ids (PATH disks) can cause; Mesos
    /// aborts there.
    pub fn existing_volumes(
        &self,
        total: &Resources,
        listed: &[Volume],
    ) -> Result<ExistingVolumes, ResourceError> {
        let mut cleanup = Conversion::default();
        let mut duplicates = Vec::new();
        let mut by_id: BTreeMap<&str, &Resource> = BTreeMap::new();
        for resource in total {
            let Some(id) = disk_id(resource) else {
                continue;
            };
            if by_id.contains_key(id) {
                cleanup.consumed.add(resource);
                duplicates.push(resource.clone());
            } else {
                by_id.insert(id, resource);
            }
        }

        // The listing's first entry of each id, in listing order. Its disk ("discovered"
        // in Mesos's terms) is made only where it is compared or added: with 100,000
        // volumes a collection of them all was as large as the total, and a fifth of
        // the restart's peak of memory.
        let mut first: HashMap<&str, &Volume> = HashMap::with_capacity(listed.len());
        let mut unique = Vec::with_capacity(listed.len());
        let mut repeated_in_listing = Vec::new();
        let mut drifted = Vec::new();
        for volume in listed {
            let id = volume.volume_id.as_str();
            match first.entry(id) {
                Entry::Occupied(_) => {
                    repeated_in_listing.push(id.to_owned());
                    continue;
                }
                Entry::Vacant(slot) => {
                    slot.insert(volume);
                    unique.push(volume);
                }
            }
            let Some(checkpointed) = by_id.get(id).copied() else {
                continue;
            };
            let metadata = context_metadata(volume);
            // Mesos compares with `metadata.getOrElse(Labels())`: absent and empty agree.
            let current = source(checkpointed).and_then(|s| s.metadata.as_ref());
            let wanted = metadata.clone().unwrap_or_default();
            if !labels_eq(
                Some(current.cloned().unwrap_or_default()).as_ref(),
                Some(&wanted),
            ) {
                cleanup.consumed.add(checkpointed);
                let mut changed = checkpointed.clone();
                source_mut(&mut changed).metadata = metadata;
                cleanup.converted.add(&changed);
                drifted.push(id.to_owned());
            }
        }
        let discovered = |volume: &Volume| {
            self.discovered_disk(volume, by_id.get(volume.volume_id.as_str()).copied())
        };

        // Mesos `computeConversion(checkpointed, discovered)` over the resources with an
        // id after the cleanup, pairing each with the listed volume of its id: the only
        // discovered disk its unconverted form can equal (ids are unique on both sides
        // by now).
        let mut matched: HashSet<&str> = HashSet::with_capacity(first.len());
        let mut consumed = Resources::new();
        let mut missing_converted = Vec::new();
        // The common case (a conforming plugin whose listing matches) needs no copy of
        // the total's volumes: a copy was a third of the subscription's peak of memory
        // with 10,000 volumes.
        let with_id;
        let checkpointed: Box<dyn Iterator<Item = &Resource>> = if cleanup.is_noop() {
            Box::new(total.iter().filter(|r| disk_id(r).is_some()))
        } else {
            with_id = total.filter(|r| disk_id(r).is_some()).apply(&cleanup)?;
            Box::new(with_id.iter())
        };
        for resource in checkpointed {
            let unconverted = self.unconverted(resource);
            let listed = disk_id(resource).and_then(|id| first.get(id));
            if let Some(volume) = listed
                && let Some(disk) = discovered(volume)
                && resource_eq(&disk, &unconverted)
            {
                matched.insert(volume.volume_id.as_str());
            } else if Resources::from(unconverted.clone()) == Resources::from(resource.clone()) {
                consumed.add(&unconverted);
            } else {
                missing_converted.push(resource.clone());
            }
        }
        let mut converted = Resources::new();
        for volume in unique {
            if !matched.contains(volume.volume_id.as_str())
                && let Some(disk) = discovered(volume)
            {
                converted.add(&disk);
            }
        }
        let merge = ComputedConversion {
            conversion: Conversion {
                consumed,
                converted,
            },
            missing_converted,
        };
        Ok(ExistingVolumes {
            cleanup,
            merge,
            duplicates,
            drifted,
            repeated_in_listing,
        })
    }

    /// The disk a listed volume makes (§6.3 step 2): a RAW disk with the vendor, its id,
    /// the listed context as metadata (none if empty) and the profile of `checkpointed`,
    /// the total's resource of that id. A known volume keeps the size its resource has: a
    /// plugin that created more than was asked (or lists a rounded size) still has the
    /// same volume, and the disk's size is the one frameworks were given
    /// (`created_disk`). The listed size counts for volumes not in the total, and a zero
    /// listed size still means "unknown", as in Mesos: `None`, nothing discovered.
    fn discovered_disk(
        &self,
        volume: &Volume,
        checkpointed: Option<&Resource>,
    ) -> Option<Resource> {
        let id = volume.volume_id.as_str();
        let metadata = context_metadata(volume);
        let listed_bytes = u64::try_from(volume.capacity_bytes).unwrap_or(0);
        let disk = match checkpointed {
            Some(known) if listed_bytes > 0 => self.raw_disk_mb(
                known.scalar.map_or(0.0, |s| s.value),
                disk_profile(known),
                Some(&self.vendor),
                Some(id),
                metadata,
            ),
            _ => self.raw_disk(
                listed_bytes,
                checkpointed.and_then(disk_profile),
                Some(id),
                metadata,
            ),
        };
        (!is_empty(&disk)).then_some(disk)
    }

    /// The disks slrp grew (`slrp ctl expand-disk`, standalone only) at their new size:
    /// every resource of an id in `expanded` (volume id → bytes) that is smaller becomes
    /// the same resource (profile, kind, reservations, persistence, ...) of that size,
    /// in whole MB as Mesos counts disk. Not part of Mesos's reconciliation, which keeps
    /// a known volume's size whatever the plugin says ([`Self::existing_volumes`]); the
    /// pool the growth took space from shrinks by the same reconciliation's GetCapacity.
    pub fn grown_disks(&self, total: &Resources, expanded: &BTreeMap<String, u64>) -> Conversion {
        let mut grown = Conversion::default();
        if expanded.is_empty() {
            return grown;
        }
        for resource in total {
            let Some(bytes) = disk_id(resource).and_then(|id| expanded.get(id)) else {
                continue;
            };
            #[allow(clippy::cast_precision_loss)]
            let mb = (*bytes >> 20) as f64;
            let Some(scalar) = resource.scalar else {
                continue;
            };
            if scalar.value >= mb {
                continue;
            }
            let mut resized = resource.clone();
            if let Some(s) = resized.scalar.as_mut() {
                s.value = mb;
            }
            grown.consumed.add(resource);
            grown.converted.add(&resized);
        }
        grown
    }

    /// Mesos `reconcileResources` (§6.5) without the I/O: applies the volume conversions
    /// and then the pool conversion to `total` and says what changed. The caller
    /// checkpoints and sends UPDATE_STATE when [`Reconciled::changed`] (or always after a
    /// subscription).
    ///
    /// # Errors
    /// [`ResourceError::NotContained`] if a conversion does not apply (Mesos aborts).
    pub fn reconcile(
        &self,
        total: &Resources,
        volumes: &ExistingVolumes,
        pools: &ComputedConversion,
    ) -> Result<Reconciled, ResourceError> {
        let conversions = [
            &volumes.cleanup,
            &volumes.merge.conversion,
            &pools.conversion,
        ];
        // Nothing to apply (every reconciliation of a provider whose plugin and profiles
        // agree with its checkpoint, e.g. at each start): the total as it is. The general
        // path below would say the same after two copies of the total and a subtraction
        // of it from itself each way, which with 10,000 volumes was a tenth of the start.
        if conversions.iter().all(|c| c.is_noop()) {
            return Ok(Reconciled {
                total: None,
                changed: false,
                removed: Resources::new(),
                added: Resources::new(),
            });
        }
        let result = total.apply_all(conversions)?;
        // Only entries of a kind the conversions touch can differ: subtraction, addition
        // and `contains` pair an entry only with entries of its kind, whose kind key is
        // the same, and the other kinds' entries are the same in both totals (so they
        // cancel in either difference and compare equal). Comparing and subtracting just
        // the touched kinds gives Mesos's whole-total answers, in the same order, without
        // copying and subtracting 10,000 untouched volumes when one pool changed.
        let keys: std::collections::HashSet<u64> = conversions
            .iter()
            .flat_map(|c| c.consumed.iter().chain(c.converted.iter()))
            .map(kind_key)
            .collect();
        let touched = |r: &Resource| keys.contains(&kind_key(r));
        let (before, after) = (total.filter(touched), result.filter(touched));
        let changed = before != after;
        Ok(Reconciled {
            changed,
            removed: before.clone() - &after,
            added: after - &before,
            total: changed.then_some(result),
        })
    }
}

impl ProviderResources {
    /// The conversion of a finished CREATE_DISK (Mesos `applyCreateDisk`): `source` (a
    /// pool, or a RAW disk with an id for a pre-existing volume) becomes a `kind` disk
    /// with the plugin's volume id, the profile, the volume context as metadata (left as
    /// it was if the context is empty) and, for MOUNT, this provider's
    /// [`mount_root`](Self::mount_root). Reservations and everything else are kept.
    ///
    /// The disk keeps the consumed size, as in Mesos, whatever size the plugin created:
    /// a Mesos master applies the conversion to the framework's allocation and aborts
    /// when a conversion changes a quantity other than by removing it (its allocator's
    /// invariant, MESOS-8825). A plugin that rounds sizes (spec §12 item 28) is handled
    /// by the reconciliation instead: a listed volume of a known id keeps the
    /// checkpointed size ([`Self::existing_volumes`]); the real size is the volume
    /// manager's record.
    pub fn created_disk(
        &self,
        source: &Resource,
        created: &CreatedVolume<'_>,
        kind: CreatedKind,
    ) -> Conversion {
        let mut disk = source.clone();
        let s = source_mut(&mut disk);
        s.id = Some(created.id.to_owned());
        s.profile = Some(created.profile.to_owned());
        if !created.context.is_empty() {
            s.metadata = Some(labels_from_context(created.context));
        }
        match kind {
            CreatedKind::Mount => {
                s.r#type = SourceType::Mount as i32;
                s.mount = Some(self.mount_source());
            }
            CreatedKind::Block => s.r#type = SourceType::Block as i32,
        }
        Conversion {
            consumed: Resources::from(source.clone()),
            converted: Resources::from(disk),
        }
    }

    /// The conversion of a finished DESTROY_DISK (Mesos `applyDestroyDisk`): the disk
    /// becomes RAW again (MOUNT root cleared).
    ///
    /// - `deprovisioned` (the plugin deleted the volume): id and metadata are cleared, so
    ///   the space returns to its pool; if the disk has no profile or `profile_known`
    ///   says its profile is gone, the space is returned as nothing (an empty converted
    ///   side) and [`DestroyedDisk::reconcile_pools`] asks for a pool reconciliation, which
    ///   lets the currently existing profiles claim it.
    /// - not deprovisioned (no DeleteVolume capability): the volume stays, as a RAW disk
    ///   with its id and no profile.
    pub fn destroyed_disk(
        &self,
        resource: &Resource,
        deprovisioned: bool,
        profile_known: impl Fn(&str) -> bool,
    ) -> DestroyedDisk {
        let mut raw = resource.clone();
        let s = source_mut(&mut raw);
        s.r#type = SourceType::Raw as i32;
        s.mount = None;
        let mut reconcile_pools = false;
        if deprovisioned {
            s.id = None;
            s.metadata = None;
            if !s.profile.as_deref().is_some_and(&profile_known) {
                raw.scalar = Some(Scalar { value: 0.0 });
                reconcile_pools = true;
            }
        } else {
            s.profile = None;
        }
        DestroyedDisk {
            conversion: Conversion {
                consumed: Resources::from(resource.clone()),
                converted: Resources::from(raw),
            },
            reconcile_pools,
        }
    }
}

/// What CREATE_DISK made, for [`ProviderResources::created_disk`].
#[derive(Debug, Clone, Copy)]
pub struct CreatedVolume<'a> {
    /// The plugin's volume id.
    pub id: &'a str,
    /// The volume context (becomes the disk's metadata).
    pub context: &'a BTreeMap<String, String>,
    /// The profile the disk was created with.
    pub profile: &'a str,
}

/// The disk type CREATE_DISK produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreatedKind {
    /// A MOUNT disk (a file system the agent mounts under the MOUNT root).
    Mount,
    /// A BLOCK disk.
    Block,
}

/// The result of [`ProviderResources::destroyed_disk`].
#[derive(Debug, Clone, PartialEq)]
pub struct DestroyedDisk {
    /// The disk out, the freed RAW resource (possibly nothing) in.
    pub conversion: Conversion,
    /// The freed space had no live profile: reconcile the pools to recover it (Mesos
    /// does so unless a reconciliation is already pending).
    pub reconcile_pools: bool,
}

/// Mesos validates `default_reservations` with `Resources::validate` on the reservation
/// stack; these are the rules that matter to the provider.
fn validate_reservations(stack: &[ReservationInfo]) -> Result<(), ResourceError> {
    let mut parent: Option<&str> = None;
    for (index, reservation) in stack.iter().enumerate() {
        let bad = |reason| Err(ResourceError::BadReservation { index, reason });
        let kind = reservation
            .r#type
            .and_then(|t| ReservationType::try_from(t).ok());
        match (index, kind) {
            (0, Some(ReservationType::Static | ReservationType::Dynamic))
            | (_, Some(ReservationType::Dynamic)) => {}
            (0, _) => return bad("the first reservation must be STATIC or DYNAMIC"),
            (_, _) => return bad("a refined reservation must be DYNAMIC"),
        }
        let Some(role) = reservation.role.as_deref().filter(|r| !r.is_empty()) else {
            return bad("the role is missing");
        };
        // Mesos `roles::validate`: no empty, `.`, `..` or `-`-prefixed component, no
        // whitespace or DEL; `*` cannot be reserved for.
        let bad_part =
            |part: &str| part.is_empty() || part == "." || part == ".." || part.starts_with('-');
        let bad_char = |c: char| c.is_ascii_whitespace() || c == '\x0b' || c == '\x7f';
        if role == "*" || role.contains(bad_char) || role.split('/').any(bad_part) {
            return bad("the role is not a valid role name");
        }
        if let Some(parent) = parent
            && !role
                .strip_prefix(parent)
                .is_some_and(|rest| rest.starts_with('/'))
        {
            return bad("the role is not a child of the role below it");
        }
        parent = Some(role);
    }
    Ok(())
}

/// The result of [`ProviderResources::compute_conversion`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComputedConversion {
    /// What to take out of and put into the total.
    pub conversion: Conversion,
    /// Checkpointed resources that frameworks converted and the plugin no longer reports;
    /// kept. Mesos warns: "Missing converted resource '…'. This might cause further
    /// operations to fail."
    pub missing_converted: Vec<Resource>,
}

/// The result of [`ProviderResources::existing_volumes`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExistingVolumes {
    /// Removes duplicates and replaces drifted metadata (Mesos's `metadataConversion`).
    pub cleanup: Conversion,
    /// `computeConversion` of the resources with an id after `cleanup` against the
    /// listing.
    pub merge: ComputedConversion,
    /// Resources of the total removed because their id was already taken (Mesos warns
    /// "Removing duplicated volume").
    pub duplicates: Vec<Resource>,
    /// Ids whose metadata was replaced by the listed context.
    pub drifted: Vec<String>,
    /// Ids listed more than once; later copies were ignored (Mesos warns "Dropping
    /// duplicated volume").
    pub repeated_in_listing: Vec<String>,
}

/// A listed volume's context as disk metadata; `None` for an empty context.
fn context_metadata(volume: &Volume) -> Option<Labels> {
    (!volume.volume_context.is_empty()).then(|| labels_from_context(&volume.volume_context))
}

/// The result of [`ProviderResources::reconcile`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reconciled {
    /// The new total if it changed; `None`: the old one stands (not copied, which with
    /// 10,000 volumes was a copy per reconciliation for nothing).
    pub total: Option<Resources>,
    /// Whether it differs from the old total (Mesos `result != totalResources`).
    pub changed: bool,
    /// Old total minus new (Mesos logs "Removing '…' and adding '…'").
    pub removed: Resources,
    /// New total minus old.
    pub added: Resources,
}

// ---------------------------------------------------------------------------------------
// Profiles (§7.3).

/// What a reported profile set asks of the provider's profile map (§7.3 "Profile
/// update"): drop `removed`, translate `to_translate`. Successful translations are
/// inserted, failures left out (the next watch reports them again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileChange {
    /// Names in the map that the adaptor no longer reports.
    pub removed: Vec<String>,
    /// Reported names the map does not hold yet.
    pub to_translate: Vec<String>,
}

impl ProfileChange {
    /// The change from the names in the map to the reported set.
    pub fn between<'a>(
        current: impl IntoIterator<Item = &'a str>,
        reported: &BTreeSet<String>,
    ) -> Self {
        let current: BTreeSet<&str> = current.into_iter().collect();
        Self {
            removed: current
                .iter()
                .filter(|name| !reported.contains(**name))
                .map(|name| (*name).to_owned())
                .collect(),
            to_translate: reported
                .iter()
                .filter(|name| !current.contains(name.as_str()))
                .cloned()
                .collect(),
        }
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.to_translate.is_empty()
    }
}

/// Profiles of the storage pools in `total`: the profile map Mesos recovers from a
/// checkpoint holds exactly these (§7.3).
pub fn pool_profiles(total: &Resources) -> BTreeSet<String> {
    total
        .iter()
        .filter(|r| is_storage_pool(r))
        .filter_map(|r| disk_profile(r).map(str::to_owned))
        .collect()
}

/// How a change that touched only `touched` (the consumed and converted resources of
/// its conversions) changed [`pool_profiles`] of the `total` after it: for the profile of
/// every storage pool in `touched`, whether `total` still has a pool with it. Profiles of
/// pools the change did not touch are as they were, so this costs what the change
/// touched, not the size of the total, where [`pool_profiles`] is a scan of the total.
/// The pools of a touched pool's kind (one index lookup) are looked at first; only when
/// none of them has the profile (the last pool of that kind was consumed) is the total
/// scanned for another pool of it (differently reserved, say).
pub fn pool_profile_changes(total: &Resources, touched: &Resources) -> BTreeMap<String, bool> {
    let has_profile = |resource: &Resource, profile: &str| {
        is_storage_pool(resource) && disk_profile(resource) == Some(profile)
    };
    let mut changes = BTreeMap::new();
    for pool in touched.iter().filter(|r| is_storage_pool(r)) {
        let Some(profile) = disk_profile(pool) else {
            continue;
        };
        if changes.contains_key(profile) {
            continue;
        }
        let present = total
            .possibly_alike(pool)
            .into_iter()
            .any(|entry| has_profile(entry, profile))
            || total.iter().any(|entry| has_profile(entry, profile));
        changes.insert(profile.to_owned(), present);
    }
    changes
}

/// Storage pools of `total` whose profile is not in `known`: converted pools (e.g. with
/// a refined reservation) outlive their profile, because `computeConversion` keeps
/// converted resources. Mesos asserts on the next checkpoint that every pool's profile is
/// known and aborts (spec §12 item 11); a provider reports these instead and keeps them.
pub fn pools_without_profile<'a>(
    total: &'a Resources,
    known: &BTreeSet<String>,
) -> Vec<&'a Resource> {
    total
        .iter()
        .filter(|r| is_storage_pool(r) && disk_profile(r).is_some_and(|p| !known.contains(p)))
        .collect()
}
