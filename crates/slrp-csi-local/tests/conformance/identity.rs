//! csi-sanity's Identity Service cases.

use super::*;

// ===================== Identity Service =====================

/// Identity Service / GetPluginCapabilities / should return appropriate capabilities.
#[tokio::test]
async fn sanity_identity_get_plugin_capabilities() {
    use v1::plugin_capability::{Type, service, volume_expansion};
    let s = Sanity::start().await;
    let res =
        s.c.identity
            .clone()
            .get_plugin_capabilities(v1::GetPluginCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
    for cap in res.capabilities {
        match cap.r#type {
            Some(Type::Service(svc)) => assert!(matches!(
                service::Type::try_from(svc.r#type),
                Ok(service::Type::ControllerService
                    | service::Type::VolumeAccessibilityConstraints
                    | service::Type::GroupControllerService
                    | service::Type::SnapshotMetadataService)
            )),
            Some(Type::VolumeExpansion(e)) => assert!(matches!(
                volume_expansion::Type::try_from(e.r#type),
                Ok(volume_expansion::Type::Online | volume_expansion::Type::Offline)
            )),
            None => panic!("capability without a type"),
        }
    }
    s.cleanup().await;
}

/// Identity Service / Probe / should return appropriate information.
#[tokio::test]
async fn sanity_identity_probe() {
    let s = Sanity::start().await;
    let res =
        s.c.identity
            .clone()
            .probe(v1::ProbeRequest {})
            .await
            .unwrap()
            .into_inner();
    assert_eq!(res.ready, Some(true));
    s.cleanup().await;
}

/// Identity Service / GetPluginInfo / should return appropriate information.
#[tokio::test]
async fn sanity_identity_get_plugin_info() {
    let s = Sanity::start().await;
    let res =
        s.c.identity
            .clone()
            .get_plugin_info(v1::GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
    assert!(sanity_name_ok(&res.name), "{}", res.name);
    assert!(!res.vendor_version.is_empty());
    assert!(!sanity_name_ok("1bad") && !sanity_name_ok("bad.") && !sanity_name_ok("x"));
    s.cleanup().await;
}
