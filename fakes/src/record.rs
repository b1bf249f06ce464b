//! Serde forms for what a run keeps for its checks (the stored record a run
//! is re-judged from): gRPC codes by their spec names, generated protobuf
//! messages as their own wire bytes (lossless, and no serde on generated code).

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `tonic::Code` as `NOT_FOUND`, `OK`, ….
pub mod grpc_code {
    use super::*;

    /// Write the spec name.
    pub fn serialize<S: Serializer>(code: &tonic::Code, s: S) -> Result<S::Ok, S::Error> {
        crate::cosi_sidecar::code_name(*code).serialize(s)
    }

    /// Read a spec name back.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<tonic::Code, D::Error> {
        let name = String::deserialize(d)?;
        parse(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown gRPC code {name:?}")))
    }

    /// The code named `name` (`NOT_FOUND`).
    pub fn parse(name: &str) -> Option<tonic::Code> {
        (0..=16)
            .map(tonic::Code::from_i32)
            .find(|c| crate::cosi_sidecar::code_name(*c) == name)
    }
}

/// A generated message as base64 of its protobuf encoding.
pub mod message {
    use super::*;

    /// Encode.
    pub fn serialize<M: prost::Message, S: Serializer>(m: &M, s: S) -> Result<S::Ok, S::Error> {
        base64::engine::general_purpose::STANDARD
            .encode(m.encode_to_vec())
            .serialize(s)
    }

    /// Decode.
    pub fn deserialize<'de, M: prost::Message + Default, D: Deserializer<'de>>(
        d: D,
    ) -> Result<M, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)?;
        M::decode(bytes.as_slice()).map_err(serde::de::Error::custom)
    }
}

/// An optional generated message, as [`message`] or null.
pub mod opt_message {
    use super::*;

    /// Encode.
    pub fn serialize<M: prost::Message, S: Serializer>(
        m: &Option<M>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        m.as_ref()
            .map(|m| base64::engine::general_purpose::STANDARD.encode(m.encode_to_vec()))
            .serialize(s)
    }

    /// Decode.
    pub fn deserialize<'de, M: prost::Message + Default, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<M>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)?;
        M::decode(bytes.as_slice())
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_code_round_trips_by_name() {
        for i in 0..=16 {
            let c = tonic::Code::from_i32(i);
            let name = crate::cosi_sidecar::code_name(c);
            assert_eq!(super::grpc_code::parse(&name), Some(c), "{name}");
        }
        assert_eq!(super::grpc_code::parse("NOPE"), None);
    }
}
