//! The catalogue of stubbed RPCs: which services exist, which methods each has, and the stable
//! order `GetStats` reports them in.

use std::fmt;
use std::str::FromStr;

/// One of the four stubbed downstream services, by the short name `Configure` and the command
/// line use (`cart`, `fraud`, `inventory`, `wallet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// `cart.v1.CartService`.
    Cart,
    /// `fraud.v1.FraudService`.
    Fraud,
    /// `inventory.v1.InventoryService`.
    Inventory,
    /// `wallet.v1.WalletService`.
    Wallet,
}

impl Service {
    /// Every service, in reporting order.
    pub const ALL: [Service; 4] = [
        Service::Cart,
        Service::Fraud,
        Service::Inventory,
        Service::Wallet,
    ];

    /// The short name (`wallet`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cart => "cart",
            Self::Fraud => "fraud",
            Self::Inventory => "inventory",
            Self::Wallet => "wallet",
        }
    }

    /// This service's methods, in reporting order.
    pub fn methods(self) -> impl Iterator<Item = Method> {
        Method::ALL.into_iter().filter(move |m| m.service() == self)
    }

    /// The method of this service called `name` (the RPC name, e.g. `Hold`).
    pub fn method(self, name: &str) -> Option<Method> {
        self.methods().find(|m| m.name() == name)
    }

    /// The RPC names of this service, comma-separated, for error messages.
    pub fn method_names(self) -> String {
        self.methods()
            .map(Method::name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A service name that is not one of `cart`, `fraud`, `inventory`, `wallet`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown service {0:?} (expected cart, fraud, inventory or wallet)")]
pub struct UnknownService(pub String);

impl FromStr for Service {
    type Err = UnknownService;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Service::ALL
            .into_iter()
            .find(|service| service.as_str() == s)
            .ok_or_else(|| UnknownService(s.to_owned()))
    }
}

/// One stubbed RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `cart.v1.CartService/FreezeCart`.
    CartFreezeCart,
    /// `fraud.v1.FraudService/Score`.
    FraudScore,
    /// `inventory.v1.InventoryService/Reserve`.
    InventoryReserve,
    /// `inventory.v1.InventoryService/Commit`.
    InventoryCommit,
    /// `inventory.v1.InventoryService/Release`.
    InventoryRelease,
    /// `wallet.v1.WalletService/Hold`.
    WalletHold,
    /// `wallet.v1.WalletService/Capture`.
    WalletCapture,
    /// `wallet.v1.WalletService/Release`.
    WalletRelease,
    /// `wallet.v1.WalletService/LookupByReference`.
    WalletLookupByReference,
}

impl Method {
    /// How many methods there are.
    pub const COUNT: usize = 9;

    /// Every method, in the order `GetStats` reports them.
    pub const ALL: [Method; Method::COUNT] = [
        Method::CartFreezeCart,
        Method::FraudScore,
        Method::InventoryReserve,
        Method::InventoryCommit,
        Method::InventoryRelease,
        Method::WalletHold,
        Method::WalletCapture,
        Method::WalletRelease,
        Method::WalletLookupByReference,
    ];

    /// The service this method belongs to.
    pub fn service(self) -> Service {
        match self {
            Self::CartFreezeCart => Service::Cart,
            Self::FraudScore => Service::Fraud,
            Self::InventoryReserve | Self::InventoryCommit | Self::InventoryRelease => {
                Service::Inventory
            }
            Self::WalletHold
            | Self::WalletCapture
            | Self::WalletRelease
            | Self::WalletLookupByReference => Service::Wallet,
        }
    }

    /// The RPC name (`Hold`).
    pub fn name(self) -> &'static str {
        match self {
            Self::CartFreezeCart => "FreezeCart",
            Self::FraudScore => "Score",
            Self::InventoryReserve => "Reserve",
            Self::InventoryCommit => "Commit",
            Self::WalletCapture => "Capture",
            Self::InventoryRelease | Self::WalletRelease => "Release",
            Self::WalletHold => "Hold",
            Self::WalletLookupByReference => "LookupByReference",
        }
    }

    /// Whether a successful call changes state (and so can be logged as an effect). Methods
    /// without one treat `FAULT_AMBIGUOUS` like `FAULT_HANG`.
    pub fn has_effect(self) -> bool {
        !matches!(
            self,
            Self::CartFreezeCart | Self::FraudScore | Self::WalletLookupByReference
        )
    }

    /// This method's position in [`Method::ALL`], for per-method tables.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.service(), self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_follow_the_reporting_order() {
        for (i, method) in Method::ALL.into_iter().enumerate() {
            assert_eq!(method.index(), i);
        }
    }

    #[test]
    fn methods_are_found_by_service_and_rpc_name() {
        assert_eq!(
            Service::Wallet.method("Release"),
            Some(Method::WalletRelease)
        );
        assert_eq!(
            Service::Inventory.method("Release"),
            Some(Method::InventoryRelease)
        );
        assert_eq!(Service::Cart.method("Hold"), None);
        assert_eq!("wallet".parse(), Ok(Service::Wallet));
        assert!("Wallet".parse::<Service>().is_err());
    }
}
