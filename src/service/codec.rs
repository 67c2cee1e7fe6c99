//! The protobuf codec of the Batcher service: prost's, except that a message
//! that cannot be decoded (a `string` field that is not UTF-8, a truncated
//! field) is `INVALID_ARGUMENT` naming the field, like any other bad input,
//! instead of tonic's `INTERNAL`, which would blame the service.

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::error::invalid;

/// prost's codec with [`MessageDecoder`]; `build.rs` names it as the codec
/// of the generated server and client.
#[derive(Debug)]
pub struct BatcherCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for BatcherCodec<T, U> {
    fn default() -> Self {
        BatcherCodec(PhantomData)
    }
}

impl<T, U> Codec for BatcherCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = MessageDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        MessageDecoder(ProstDecoder::default())
    }
}

/// prost's decoder, with decode errors as `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct MessageDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for MessageDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|err| decode_error(&err.to_string()).into())
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// The error for prost's message `failed to decode Protobuf message:
/// Item.id: AddRequest.item: invalid string value: ...`, whose (message,
/// field) pairs run from the innermost field out: the field path
/// (`item.id`) and what is wrong with it.
fn decode_error(text: &str) -> crate::error::Error {
    let rest = text
        .strip_prefix("failed to decode Protobuf message: ")
        .unwrap_or(text);
    let mut fields = Vec::new();
    let mut what = rest;
    while let Some((head, tail)) = what.split_once(": ") {
        match head.split_once('.') {
            Some((message, field)) if is_name(message) && is_name(field) => fields.push(field),
            _ => break,
        }
        what = tail;
    }
    fields.reverse();
    let field = if fields.is_empty() {
        "(message)".to_owned()
    } else {
        fields.join(".")
    };
    invalid(field, format!("cannot be decoded: {what}"))
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, Violation};

    fn violation(text: &str) -> Violation {
        match decode_error(text) {
            Error::InvalidArgument(mut v) => v.remove(0),
            other => panic!("not invalid: {other:?}"),
        }
    }

    /// The field path of a nested decode error runs from the request down.
    #[test]
    fn names_the_nested_field() {
        let v = violation(
            "failed to decode Protobuf message: Item.id: AddRequest.item: \
             invalid string value: data is not UTF-8 encoded",
        );
        assert_eq!(v.field, "item.id");
        assert_eq!(
            v.message,
            "cannot be decoded: invalid string value: data is not UTF-8 encoded"
        );
    }

    /// An error outside any field still reads as a sentence.
    #[test]
    fn without_a_field() {
        let v = violation("failed to decode Protobuf message: buffer underflow");
        assert_eq!(v.field, "(message)");
        assert_eq!(v.message, "cannot be decoded: buffer underflow");
    }
}
