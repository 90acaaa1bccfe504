//! Generated protobuf and gRPC code for slrp's wire protocols.
//!
//! # Overview
//! Everything in this crate except this file is produced by `cargo xtask codegen` from the
//! `.proto` files under `proto/` (slrp's own definitions of the CSI and Mesos wire formats,
//! with the exact package, message and field numbers of the originals). CI regenerates the
//! code and fails when the committed copy is stale.
//!
//! # Layout
//! The module tree mirrors the protobuf packages, because prost refers to other packages
//! through relative `super::` paths:
//! - [`csi::v0`], [`csi::v1`]: CSI messages plus tonic clients and servers;
//! - [`mesos::v1`]: the Mesos types the provider needs (resources, operations, plugin info);
//! - [`mesos::v1::resource_provider`]: the resource provider API `Call` and `Event`;
//! - [`mesos::v1::agent`]: the agent operator API subset used for standalone containers;
//! - [`mesos::resource_provider`], [`mesos::csi::state`], [`mesos::internal`]: the Mesos
//!   storage local resource provider's checkpoint messages (`resource_provider.state`,
//!   `volume.state`, `operation.updates`), which `slrp import-mesos` reads and tests write.
//!
//! [`redact`] implements `Debug` for the messages that carry secrets, with the values
//! redacted.
//!
//! [`descriptor_pool`] exposes the descriptors of all of the above for reflection
//! (Mesos-style JSON, proto2 `required` checks, secret redaction).
//!
//! # Limitations
//! The Mesos files are subsets: messages irrelevant to storage carry only the fields slrp
//! reads. Unknown fields are dropped when such a message is decoded and re-encoded.

use std::sync::OnceLock;

use prost_reflect::DescriptorPool;

/// CSI, the Container Storage Interface.
pub mod csi {
    /// CSI spec 0.3 (package `csi.v0`), wire-compatible with 0.2 plugins.
    #[allow(
        missing_docs,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        rust_2018_idioms
    )]
    pub mod v0 {
        include!("generated/csi.v0.rs");
    }
    /// CSI spec 1.x (package `csi.v1`).
    #[allow(
        missing_docs,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        rust_2018_idioms
    )]
    pub mod v1 {
        include!("generated/csi.v1.rs");
    }
}

/// Apache Mesos: the v1 APIs and the storage local resource provider's checkpoints.
pub mod mesos {
    /// Package `mesos.v1`: resources, operations, plugin and container descriptions.
    #[allow(
        missing_docs,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        rust_2018_idioms
    )]
    pub mod v1 {
        include!("generated/mesos.v1.rs");

        /// Package `mesos.v1.resource_provider`: the resource provider API.
        #[allow(
            missing_docs,
            unreachable_pub,
            clippy::all,
            clippy::pedantic,
            rust_2018_idioms
        )]
        pub mod resource_provider {
            include!("generated/mesos.v1.resource_provider.rs");
        }

        /// Package `mesos.v1.agent`: the agent operator API (subset).
        #[allow(
            missing_docs,
            unreachable_pub,
            clippy::all,
            clippy::pedantic,
            rust_2018_idioms
        )]
        pub mod agent {
            include!("generated/mesos.v1.agent.rs");
        }
    }

    /// Package `mesos.resource_provider`: the provider's checkpoint `ResourceProviderState`.
    #[allow(
        missing_docs,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        rust_2018_idioms
    )]
    pub mod resource_provider {
        include!("generated/mesos.resource_provider.rs");
    }

    /// Mesos's CSI support.
    pub mod csi {
        /// Package `mesos.csi.state`: the volume manager's checkpoint `VolumeState`.
        #[allow(
            missing_docs,
            unreachable_pub,
            clippy::all,
            clippy::pedantic,
            rust_2018_idioms
        )]
        pub mod state {
            include!("generated/mesos.csi.state.rs");
        }
    }

    /// Package `mesos.internal` (subset): the records of an operation's status stream.
    #[allow(
        missing_docs,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        rust_2018_idioms
    )]
    pub mod internal {
        include!("generated/mesos.internal.rs");
    }
}

pub mod redact;

/// The encoded `FileDescriptorSet` of every file above (including imported well-known types).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/file_descriptor_set.bin");

/// Descriptors of every message in this crate, decoded once.
pub fn descriptor_pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(FILE_DESCRIPTOR_SET)
            .expect("the embedded descriptor set is produced by xtask codegen and always valid")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::{Message, Name};

    #[test]
    fn descriptor_pool_knows_every_generated_package() {
        let pool = descriptor_pool();
        for name in [
            mesos::v1::resource_provider::Call::full_name(),
            mesos::v1::resource_provider::Event::full_name(),
            mesos::v1::Resource::full_name(),
            mesos::v1::agent::Call::full_name(),
            csi::v1::CreateVolumeRequest::full_name(),
            csi::v0::CreateVolumeRequest::full_name(),
            mesos::resource_provider::ResourceProviderState::full_name(),
            mesos::csi::state::VolumeState::full_name(),
            mesos::internal::UpdateOperationStatusRecord::full_name(),
            mesos::internal::UpdateOperationStatusMessage::full_name(),
        ] {
            assert!(pool.get_message_by_name(&name).is_some(), "{name} missing");
        }
    }

    #[test]
    fn subscribe_call_type_encodes_as_mesos_does() {
        use mesos::v1::resource_provider::{Call, call};
        let call = Call {
            r#type: Some(call::Type::Subscribe as i32),
            ..Default::default()
        };
        // Field 2, varint, value 1 (SUBSCRIBE).
        assert_eq!(call.encode_to_vec(), vec![16, 1]);
    }

    /// A provider holds its total, and the manager its view, as 10,000s of `Resource`s:
    /// the rarely set sub-messages are boxed by the code generator (`xtask`), and a
    /// generator change that unboxed them would double the resident set (docs/benchmarks.md).
    #[test]
    fn resources_and_operations_stay_small_inline() {
        use mesos::v1::{Resource, Volume, offer};
        let resource = std::mem::size_of::<Resource>();
        assert!(
            resource < std::mem::size_of::<Volume>(),
            "a Resource is {resource} bytes inline: is DiskInfo.volume still boxed?"
        );
        let operation = std::mem::size_of::<offer::Operation>();
        assert!(
            operation < 3 * resource,
            "an Offer.Operation is {operation} bytes inline: are its payloads still boxed?"
        );
        let round_trip = Resource {
            disk: Some(mesos::v1::resource::DiskInfo {
                volume: Some(Box::new(Volume {
                    container_path: "data".to_owned(),
                    ..Volume::default()
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        let bytes = round_trip.encode_to_vec();
        assert_eq!(Resource::decode(bytes.as_slice()).ok(), Some(round_trip));
    }
}
