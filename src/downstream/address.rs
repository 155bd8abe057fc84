//! Where the four downstream services are (`[downstream]`, `--downstream`), and how an address
//! is read: `host:port` (plain HTTP/2, as `--listen` and grpcurl take it) or an `http://` URI,
//! `https://` when a `[downstream_tls]` section is configured.

use serde::Deserialize;

/// Addresses of the four downstream services: `host:port` or an `http://` URI. Checked at
/// start (see [`downstream_uri`]), so a typo stops the start instead of declining every order.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DownstreamAddrs {
    /// `cart.v1.CartService`.
    pub cart: String,
    /// `fraud.v1.FraudService`.
    pub fraud: String,
    /// `inventory.v1.InventoryService`.
    pub inventory: String,
    /// `wallet.v1.WalletService`.
    pub wallet: String,
}

impl DownstreamAddrs {
    /// All four services at one address (a `checkout stubs` server).
    pub fn all_at(uri: &str) -> Self {
        Self {
            cart: uri.to_owned(),
            fraud: uri.to_owned(),
            inventory: uri.to_owned(),
            wallet: uri.to_owned(),
        }
    }

    /// Every service with its config key.
    pub fn named(&self) -> [(&'static str, &str); 4] {
        [
            ("downstream.cart", &self.cart),
            ("downstream.fraud", &self.fraud),
            ("downstream.inventory", &self.inventory),
            ("downstream.wallet", &self.wallet),
        ]
    }
}

impl Default for DownstreamAddrs {
    fn default() -> Self {
        Self::all_at("127.0.0.1:50052")
    }
}

/// A downstream address that cannot be used; the message names its config key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} = {addr:?}: {why}; expected host:port (e.g. 127.0.0.1:50052) or http://host:port")]
pub struct InvalidAddress {
    /// The key that gave the address (`downstream.cart`).
    pub key: String,
    /// The address as given.
    pub addr: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// The URI of a downstream address given under `key`: `host:port` means `http://host:port`;
/// an `http://host[:port]` URI is taken as it is, and an `https://` one when `tls` (a
/// `[downstream_tls]` section) is configured. Anything else is refused with a message naming
/// the key.
pub fn downstream_uri(key: &str, addr: &str, tls: bool) -> Result<http::Uri, InvalidAddress> {
    let refuse = |why: &'static str| {
        Err(InvalidAddress {
            key: key.to_owned(),
            addr: addr.to_owned(),
            why,
        })
    };
    let text = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let Ok(uri) = text.parse::<http::Uri>() else {
        return refuse("not an address");
    };
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") if tls => {}
        Some("https") => {
            return refuse(
                "https:// needs a [downstream_tls] section (ca, cert, key), which is not set",
            );
        }
        _ => return refuse("the scheme must be http or https"),
    }
    let Some(authority) = uri.authority() else {
        return refuse("no host");
    };
    if authority.host().is_empty() || (!addr.contains("://") && authority.port().is_none()) {
        return refuse("no port");
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return refuse("a path is not allowed");
    }
    Ok(uri)
}
