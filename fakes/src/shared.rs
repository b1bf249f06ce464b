//! Equal values held once: for the many copies a long run keeps of a few
//! distinct values (a class's parameters in every grant, a bucket's policy
//! document for every user). Values are cheap to clone (an `Arc` inside).

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Mutex;

/// The values seen so far, each held once; handed out as clones of that one.
#[derive(Debug)]
pub struct Shared<T>(Mutex<HashSet<T>>);

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Self(Mutex::new(HashSet::new()))
    }
}

impl<T: Clone + Hash + Eq> Shared<T> {
    /// `value`, or the equal one seen before (sharing what it holds).
    pub fn get(&self, value: T) -> T {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match seen.get(&value) {
            Some(held) => held.clone(),
            None => {
                seen.insert(value.clone());
                value
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn an_equal_value_is_the_one_held_and_another_is_kept_apart() {
        let shared = Shared::default();
        let a = shared.get(Arc::<str>::from("class parameters"));
        let b = shared.get(Arc::<str>::from("class parameters"));
        let c = shared.get(Arc::<str>::from("other parameters"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(&*c, "other parameters");
    }
}
