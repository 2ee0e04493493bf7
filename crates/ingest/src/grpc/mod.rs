//! The gRPC services, one per file: `IngestService` (`ingest.rs`, `ListEvents` in `list.rs`), `RecipientService`
//! (`recipients.rs`, its data rights in `data.rs`), `TypeService` (`types.rs`), `TopicService` (`topics.rs`) and `WebhookService`
//! (`webhooks.rs`), all
//! implemented on [`Services`]. Every method goes through `Services::call`, which
//! authenticates the caller before anything else.
//!
//! Dependencies point one way: `grpc` -> `writer` -> `planning`; nothing outside this
//! module imports from it.

/// Implements a tonic service trait for [`Services`] by delegation: every method goes
/// through [`Services::call`] with the service's `need`, then calls the inherent method of
/// the same name with the request message (`fn`), or with the caller and the message
/// (`caller fn`). Associated stream types are declared first (`type X = Y;`).
macro_rules! delegate_service {
    (
        impl $service:path, $need:expr;
        $(type $assoc:ident = $assoc_ty:ty;)*
        $(fn $method:ident($req:ty) -> $resp:ty;)*
        $(caller fn $cmethod:ident($creq:ty) -> $cresp:ty;)*
    ) => {
        #[tonic::async_trait]
        impl $service for Services {
            $(type $assoc = $assoc_ty;)*
            $(
                async fn $method(
                    &self,
                    req: tonic::Request<$req>,
                ) -> Result<tonic::Response<$resp>, tonic::Status> {
                    self.call(req, $need, |_, r| Services::$method(self, r)).await
                }
            )*
            $(
                async fn $cmethod(
                    &self,
                    req: tonic::Request<$creq>,
                ) -> Result<tonic::Response<$cresp>, tonic::Status> {
                    self.call(req, $need, |caller, r| Services::$cmethod(self, caller, r))
                        .await
                }
            )*
        }
    };
}

mod cancel;
mod data;
mod ingest;
mod list;
mod recipients;
mod topics;
mod types;
mod webhooks;

use crate::auth::{Auth, Caller, Need};
use crate::error::ApiError;
use crate::writer::{EventWriter, WriterConfig};
use notify_core::links::LinkPolicy;
use notify_store::PgPool;
use std::future::Future;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Shared state of the services.
#[derive(Clone)]
pub struct Services {
    pool: PgPool,
    writer: EventWriter,
    auth: Arc<Auth>,
    links: LinkPolicy,
}

impl Services {
    /// Services over `pool`; `CreateEvent` writes through a group-commit writer started
    /// here with `writer` settings; callers are checked by `auth`; links in events must
    /// pass `links`.
    ///
    /// # Errors
    /// The operating system's, when the writer's thread cannot start
    /// ([`EventWriter::start`]).
    pub fn new(
        pool: PgPool,
        writer: WriterConfig,
        auth: Arc<Auth>,
        links: LinkPolicy,
    ) -> std::io::Result<Self> {
        Ok(Self {
            writer: EventWriter::start(&pool, writer)?,
            pool,
            auth,
            links,
        })
    }

    /// The one authenticate-then-call wrapper of every gRPC method (health aside).
    ///
    /// `Auth::caller` runs first, before anything is read or written: it authenticates the
    /// request (`UNAUTHENTICATED`), counts it against the key's call rate
    /// (`RESOURCE_EXHAUSTED`) and authorises `need` (`PERMISSION_DENIED`). Only then does
    /// `handler` run with the caller and the request message; it authorises and counts
    /// what is specific to its method (for `CreateEvent`: type scope, recipient limit,
    /// token bucket) before validating. Its error goes through the one mapping to a status
    /// (`crate::error`).
    async fn call<T, R, F, Fut>(
        &self,
        req: Request<T>,
        need: Need,
        handler: F,
    ) -> Result<Response<R>, Status>
    where
        F: FnOnce(Caller, T) -> Fut,
        Fut: Future<Output = Result<R, ApiError>>,
    {
        let caller = self.auth.caller(&req, need)?;
        Ok(Response::new(handler(caller, req.into_inner()).await?))
    }
}
