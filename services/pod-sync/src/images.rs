//! Images, as upstream's `pkg/kubelet/images` and `pkg/credentialprovider`: references
//! parsed as the distribution library parses them, registry credentials, one pull, and the
//! image garbage collector.

pub(crate) mod credentials;
pub(crate) mod image_gc;
pub(crate) mod image_ref;
pub(crate) mod pull;
