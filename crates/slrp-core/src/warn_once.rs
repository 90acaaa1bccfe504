//! [`WarnOnChange`]: a warning about a plugin's listing that would repeat at every
//! reconciliation, logged when what it says changes instead (issue #26).
//!
//! A plugin that lists a volume twice does so at every reconciliation; at a 1 s interval
//! a warning per duplicate per reconciliation is thousands of lines a minute that say
//! nothing new and bury what does. The provider asks [`WarnOnChange::fresh`] for the items
//! it would warn about: only those it did not warn about last time come back, so each is
//! logged once when it appears, and again only if it goes away and comes back.

use std::collections::BTreeSet;

/// The items warned about at the last reconciliation; see the module docs.
#[derive(Debug, Default, Clone)]
pub struct WarnOnChange {
    last: BTreeSet<String>,
}

impl WarnOnChange {
    /// The items of `now` that were not in the last call's `now`; `now` is remembered.
    pub fn fresh<'a>(&mut self, now: &'a [String]) -> Vec<&'a str> {
        let fresh = now
            .iter()
            .filter(|item| !self.last.contains(item.as_str()))
            .map(String::as_str)
            .collect();
        self.last = now.iter().cloned().collect();
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_fresh_when_it_appears_and_again_after_it_went_away() {
        let mut w = WarnOnChange::default();
        let v = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        // (listing, warned about)
        let table: [(&[&str], &[&str]); 6] = [
            (&["a", "b"], &["a", "b"]),
            (&["a", "b"], &[]),
            (&["b", "a"], &[]),
            (&["a", "c"], &["c"]),
            (&[], &[]),
            (&["a"], &["a"]),
        ];
        for (now, want) in table {
            let now = v(now);
            assert_eq!(w.fresh(&now), want.to_vec(), "{now:?}");
        }
    }
}
