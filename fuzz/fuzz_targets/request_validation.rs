//! PlaceOrder fields of any content: validation never panics, reports violations by field,
//! and a request it accepts has the forms the store relies on (a key of 1-64 safe characters,
//! ids of at most 128 bytes without control characters, an ISO-like currency, a hash of 64
//! hex digits).

#![no_main]

use checkout::checkout::{OrderRequest, is_key, is_order_id};
use checkout::proto::checkout::v1 as pb;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Five fields separated by 0x00; then, if there is one, an expected total whose
    // minor units are the last 8 bytes.
    let mut parts = data.split(|b| *b == 0);
    let mut field = || String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let (key, customer, cart, wallet, currency) = (field(), field(), field(), field(), field());
    let expected_total = (data.len() >= 8 && data[0] % 2 == 1).then(|| pb::Money {
        currency,
        minor_units: i64::from_le_bytes(data[data.len() - 8..].try_into().unwrap_or([0; 8])),
    });
    let request = pb::PlaceOrderRequest {
        idempotency_key: key,
        customer_id: customer,
        cart_id: cart,
        wallet_account_id: wallet,
        expected_total,
    };
    let mut violations = Vec::new();
    let parsed = OrderRequest::parse("fuzz:checkout".to_owned(), request, &mut violations);
    assert!(is_order_id(&parsed.order_id));
    let hash = parsed.request_hash();
    assert!(hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()));
    if violations.is_empty() {
        assert!(is_key(&parsed.idempotency_key));
        for id in [
            &parsed.customer_id,
            &parsed.cart_id,
            &parsed.wallet_account_id,
        ] {
            assert!(!id.trim().is_empty() && id.len() <= 128);
            assert!(!id.chars().any(char::is_control));
        }
        if let Some(total) = &parsed.expected_total {
            assert!(total.minor_units >= 0 && total.currency.len() == 3);
        }
    } else {
        for v in &violations {
            assert!(!v.field.is_empty() && v.description.len() <= 128, "{v:?}");
        }
    }
});
