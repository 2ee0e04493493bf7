//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`), answered in-stream.
//!
//! tonic-reflection ends the whole stream with `NOT_FOUND` when one request names an
//! unknown symbol or file, where the protocol (reflection.proto, `ErrorResponse`: "the
//! error is returned in the response stream") answers that request with an
//! `ErrorResponse` and keeps the stream open; grpcio-reflection clients then raise on the
//! broken stream instead of the `KeyError` they map an `ErrorResponse` to. This service
//! indexes the same descriptor sets as tonic-reflection did (every message, field, oneof,
//! enum, enum value, service and method by its full name; each file by its name), serves
//! each file's bytes as they were encoded (so custom options survive), and answers every
//! request on the stream with its own response.

use futures_util::StreamExt;
use prost::Message;
use prost::encoding::{WireType, decode_key, decode_varint};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Code, Request, Response, Status, Streaming};

/// A bad descriptor set given to [`Index::new`].
#[derive(Debug, thiserror::Error)]
#[error("invalid file descriptor set: {0}")]
pub struct BadDescriptorSet(String);

/// The files and symbols reflection answers for.
#[derive(Debug, Default)]
pub struct Index {
    /// File name -> the file's encoded `FileDescriptorProto`, as given.
    files: HashMap<String, Arc<[u8]>>,
    /// Fully qualified symbol -> the encoded file that defines it.
    symbols: HashMap<String, Arc<[u8]>>,
    /// Fully qualified service names, in registration order.
    services: Vec<String>,
}

/// One request, whichever protocol version carried it.
enum Ask {
    File(String),
    Symbol(String),
    Extension,
    ExtensionNumbers(String),
    Services,
}

/// One answer, whichever protocol version carries it.
enum Answer {
    Files(Vec<Vec<u8>>),
    ExtensionNumbers(String),
    Services(Vec<String>),
    Error(Code, String),
}

impl Index {
    /// Indexes the encoded `FileDescriptorSet`s in `sets` (a file named twice is kept
    /// once), plus both reflection protocols' own files.
    ///
    /// # Errors
    /// A set that is not a valid encoded `FileDescriptorSet`, or a file without a name.
    pub fn new(sets: &[&[u8]]) -> Result<Self, BadDescriptorSet> {
        let mut index = Index::default();
        let own = [
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        for set in sets.iter().chain(own.iter()) {
            for raw in split_set(set)? {
                let fd = FileDescriptorProto::decode(raw.as_slice())
                    .map_err(|e| BadDescriptorSet(e.to_string()))?;
                index.add_file(&fd, raw.into())?;
            }
        }
        Ok(index)
    }

    fn add_file(
        &mut self,
        fd: &FileDescriptorProto,
        raw: Arc<[u8]>,
    ) -> Result<(), BadDescriptorSet> {
        let name = fd
            .name
            .clone()
            .ok_or_else(|| BadDescriptorSet("a file without a name".into()))?;
        if self.files.contains_key(&name) {
            return Ok(());
        }
        self.files.insert(name, raw.clone());
        let package = fd.package.clone().unwrap_or_default();
        for m in &fd.message_type {
            self.add_message(&raw, &package, m);
        }
        for e in &fd.enum_type {
            self.add_enum(&raw, &package, e);
        }
        for s in &fd.service {
            let service = full_name(&package, s.name());
            self.services.push(service.clone());
            for m in &s.method {
                self.symbols
                    .insert(full_name(&service, m.name()), raw.clone());
            }
            self.symbols.insert(service, raw.clone());
        }
        Ok(())
    }

    fn add_message(&mut self, raw: &Arc<[u8]>, prefix: &str, m: &DescriptorProto) {
        let name = full_name(prefix, m.name());
        for n in &m.nested_type {
            self.add_message(raw, &name, n);
        }
        for e in &m.enum_type {
            self.add_enum(raw, &name, e);
        }
        for f in &m.field {
            self.symbols.insert(full_name(&name, f.name()), raw.clone());
        }
        for o in &m.oneof_decl {
            self.symbols.insert(full_name(&name, o.name()), raw.clone());
        }
        self.symbols.insert(name, raw.clone());
    }

    fn add_enum(&mut self, raw: &Arc<[u8]>, prefix: &str, e: &EnumDescriptorProto) {
        let name = full_name(prefix, e.name());
        for v in &e.value {
            self.symbols.insert(full_name(&name, v.name()), raw.clone());
        }
        self.symbols.insert(name, raw.clone());
    }

    /// The answer to one request: an unknown file or symbol is `NOT_FOUND` in an
    /// `ErrorResponse`, extensions (which the API does not define) `UNIMPLEMENTED` by
    /// symbol and an empty list by number (grpcurl asks for them), a request without a
    /// message `INVALID_ARGUMENT`.
    fn answer(&self, ask: Option<Ask>) -> Answer {
        match ask {
            None => Answer::Error(Code::InvalidArgument, "the request names no message".into()),
            Some(Ask::File(name)) => match self.files.get(&name) {
                Some(raw) => Answer::Files(vec![raw.to_vec()]),
                None => Answer::Error(Code::NotFound, format!("file {name:?} not found")),
            },
            Some(Ask::Symbol(symbol)) => match self.symbols.get(&symbol) {
                Some(raw) => Answer::Files(vec![raw.to_vec()]),
                None => Answer::Error(Code::NotFound, format!("symbol {symbol:?} not found")),
            },
            Some(Ask::Extension) => Answer::Error(
                Code::NotFound,
                "extensions are not supported: the API defines none".into(),
            ),
            Some(Ask::ExtensionNumbers(of)) => Answer::ExtensionNumbers(of),
            Some(Ask::Services) => Answer::Services(self.services.clone()),
        }
    }
}

/// `prefix.name`, or `name` at the top level.
fn full_name(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// The raw bytes of each `FileDescriptorProto` in an encoded `FileDescriptorSet` (field
/// 1, repeated), not decoded and encoded again, so options prost does not model are kept.
fn split_set(mut buf: &[u8]) -> Result<Vec<Vec<u8>>, BadDescriptorSet> {
    let bad = |e: prost::DecodeError| BadDescriptorSet(e.to_string());
    let truncated = || BadDescriptorSet("truncated".into());
    let mut files = Vec::new();
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(bad)?;
        let skip = match wire_type {
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut buf).map_err(bad)?)
                    .map_err(|_| truncated())?;
                let field = buf.get(..len).ok_or_else(truncated)?;
                if tag == 1 {
                    files.push(field.to_vec());
                }
                len
            }
            WireType::Varint => {
                decode_varint(&mut buf).map_err(bad)?;
                0
            }
            WireType::ThirtyTwoBit => 4,
            WireType::SixtyFourBit => 8,
            WireType::StartGroup | WireType::EndGroup => {
                return Err(BadDescriptorSet("a group in a FileDescriptorSet".into()));
            }
        };
        buf = buf.get(skip..).ok_or_else(truncated)?;
    }
    Ok(files)
}

/// The reflection service of one protocol version over a shared [`Index`].
#[derive(Debug, Clone)]
pub struct Reflection(Arc<Index>);

impl Reflection {
    /// Reflection over `index`, for both versions (clone it for the second).
    pub fn new(index: Index) -> Self {
        Self(Arc::new(index))
    }
}

/// The response stream of either version.
type Answers<T> = Pin<Box<dyn futures_util::Stream<Item = Result<T, Status>> + Send + 'static>>;

/// One `ServerReflection` implementation per protocol version: the generated types of
/// `v1` and `v1alpha` have the same fields under different packages.
macro_rules! version {
    ($v:ident) => {
        impl From<tonic_reflection::pb::$v::server_reflection_request::MessageRequest> for Ask {
            fn from(
                m: tonic_reflection::pb::$v::server_reflection_request::MessageRequest,
            ) -> Self {
                use tonic_reflection::pb::$v::server_reflection_request::MessageRequest as M;
                match m {
                    M::FileByFilename(f) => Ask::File(f),
                    M::FileContainingSymbol(s) => Ask::Symbol(s),
                    M::FileContainingExtension(_) => Ask::Extension,
                    M::AllExtensionNumbersOfType(t) => Ask::ExtensionNumbers(t),
                    M::ListServices(_) => Ask::Services,
                }
            }
        }

        #[tonic::async_trait]
        impl tonic_reflection::pb::$v::server_reflection_server::ServerReflection for Reflection {
            type ServerReflectionInfoStream =
                Answers<tonic_reflection::pb::$v::ServerReflectionResponse>;

            async fn server_reflection_info(
                &self,
                req: Request<Streaming<tonic_reflection::pb::$v::ServerReflectionRequest>>,
            ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
                use pb::server_reflection_response::MessageResponse as R;
                use tonic_reflection::pb::$v as pb;
                let index = self.0.clone();
                // Every request gets its answer on the stream, an error too; the stream
                // ends when the client's does (or breaks).
                let answers = req
                    .into_inner()
                    .take_while(|r| std::future::ready(r.is_ok()))
                    .filter_map(|r| std::future::ready(r.ok()))
                    .map(move |req| {
                        let answer = index.answer(req.message_request.clone().map(Ask::from));
                        let message = match answer {
                            Answer::Files(files) => {
                                R::FileDescriptorResponse(pb::FileDescriptorResponse {
                                    file_descriptor_proto: files,
                                })
                            }
                            Answer::ExtensionNumbers(base_type_name) => {
                                R::AllExtensionNumbersResponse(pb::ExtensionNumberResponse {
                                    base_type_name,
                                    extension_number: Vec::new(),
                                })
                            }
                            Answer::Services(names) => {
                                R::ListServicesResponse(pb::ListServiceResponse {
                                    service: names
                                        .into_iter()
                                        .map(|name| pb::ServiceResponse { name })
                                        .collect(),
                                })
                            }
                            Answer::Error(code, error_message) => {
                                R::ErrorResponse(pb::ErrorResponse {
                                    error_code: code as i32,
                                    error_message,
                                })
                            }
                        };
                        Ok(pb::ServerReflectionResponse {
                            valid_host: req.host.clone(),
                            original_request: Some(req),
                            message_response: Some(message),
                        })
                    });
                Ok(Response::new(Box::pin(answers)))
            }
        }
    };
}

version!(v1);
version!(v1alpha);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_symbol_of_the_api_is_found_and_an_unknown_one_is_not() {
        let index = Index::new(&[notify_proto::FILE_DESCRIPTOR_SET]).unwrap();
        for symbol in [
            "notify.v1.IngestService",
            "notify.v1.IngestService.CreateEvent",
            "notify.v1.CreateEventRequest",
            "notify.v1.CreateEventRequest.event_key",
            "notify.v1.Delivery",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ] {
            assert!(
                matches!(index.answer(Some(Ask::Symbol(symbol.into()))), Answer::Files(f) if f.len() == 1),
                "{symbol}"
            );
        }
        assert!(matches!(
            index.answer(Some(Ask::Symbol("notify.v1.NoSuchThing".into()))),
            Answer::Error(Code::NotFound, _)
        ));
        assert!(
            index
                .services
                .contains(&"notify.v1.IngestService".to_string())
        );
    }
}
