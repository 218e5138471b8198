//! The pieces of a form both doors' pages use.

use maud::{html, Markup};

/// The hidden field every state-changing form carries.
pub fn csrf_field(csrf: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf); }
}

/// `<option>`s of `(value, label)` with `current` selected.
pub fn options(current: &str, choices: &[(&str, &str)]) -> Markup {
    html! {
        @for (value, label) in choices {
            option value=(value) selected[*value == current] { (label) }
        }
    }
}
