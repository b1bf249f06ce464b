//! Equal values held once: for the many copies a long run keeps of a few
//! distinct values (a class's parameters in every grant, a bucket's policy
//! document for every user). Values are cheap to clone (an `Arc` inside).
//! What is shared while held is shared again when read back ([`reading`]).

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
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
        held_once(&mut seen, value)
    }
}

/// `value`, or the equal one in `seen`; `value` joins `seen` if new.
fn held_once<T: Clone + Hash + Eq>(seen: &mut HashSet<T>, value: T) -> T {
    match seen.get(&value) {
        Some(held) => held.clone(),
        None => {
            seen.insert(value.clone());
            value
        }
    }
}

thread_local! {
    /// The values read so far in this thread's [`reading`] scope, per type.
    static READ: RefCell<Option<HashMap<TypeId, Box<dyn Any>>>> = const { RefCell::new(None) };
}

/// Run `f` (a deserialisation) with equal values of the types that read
/// through [`read`] read as one. A record read back would otherwise hold a
/// copy of each where the run that wrote it held one: at 10⁵ grants, the
/// read-back was the run's peak. The values seen are let go of at the end.
pub fn reading<R>(f: impl FnOnce() -> R) -> R {
    /// Ends the scope this call began, even if `f` unwinds.
    struct End(bool);
    impl Drop for End {
        fn drop(&mut self) {
            if self.0 {
                READ.with(|r| r.borrow_mut().take());
            }
        }
    }
    // A scope within a scope shares the outer one's values.
    let began = READ.with(|r| {
        let mut r = r.borrow_mut();
        if r.is_some() {
            return false;
        }
        *r = Some(HashMap::new());
        true
    });
    let _end = End(began);
    f()
}

/// `value` as read: within [`reading`], the equal value read before, if any;
/// outside it, `value` itself.
pub fn read<T: Clone + Hash + Eq + 'static>(value: T) -> T {
    READ.with(|r| {
        let mut r = r.borrow_mut();
        let Some(seen) = r.as_mut() else {
            return value;
        };
        let seen = seen
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(HashSet::<T>::new()));
        let Some(seen) = seen.downcast_mut::<HashSet<T>>() else {
            return value; // never: each entry holds its key's type
        };
        held_once(seen, value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn equal_values_read_in_a_scope_are_one_and_outside_it_apart() {
        let outside = || (read(Arc::<str>::from("doc")), read(Arc::<str>::from("doc")));
        let (a, b) = outside();
        assert!(!Arc::ptr_eq(&a, &b));

        let (a, b, c, n, m) = reading(|| {
            // A nested scope shares the outer one's values and does not end it.
            let a = reading(|| read(Arc::<str>::from("doc")));
            let b = read(Arc::<str>::from("doc"));
            let c = read(Arc::<str>::from("other"));
            // Values of another type are kept apart from these.
            let n = read(Arc::new(7u32));
            let m = read(Arc::new(7u32));
            (a, b, c, n, m)
        });
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(Arc::ptr_eq(&n, &m));
        // The scope let go of what it saw.
        assert_eq!(Arc::strong_count(&a), 2);
        let (a, b) = outside();
        assert!(!Arc::ptr_eq(&a, &b));
    }

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
