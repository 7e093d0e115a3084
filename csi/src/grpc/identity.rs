//! The CSI Identity service: name, capabilities, readiness.
//!
//! The plugin has no controller service (volumes are provisioned statically
//! or inline), so GetPluginCapabilities lists no CONTROLLER_SERVICE. Probe
//! answers `ready = false` until start-up reconciliation has finished.

use crate::grpc::proto::identity_server::Identity;
use crate::grpc::proto::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The Identity service.
#[derive(Clone)]
pub struct IdentityService {
    ready: Arc<AtomicBool>,
}

impl IdentityService {
    /// `ready` becomes true once the plugin has reconciled its volumes.
    pub fn new(ready: Arc<AtomicBool>) -> Self {
        Self { ready }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: crate::DRIVER_NAME.to_string(),
            vendor_version: crate::VERSION.to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(self.ready.load(Ordering::SeqCst)),
        }))
    }
}
