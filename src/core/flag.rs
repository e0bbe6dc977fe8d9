//! Process-wide flags with thread-scoped overrides: the machinery behind every control.
//!
//! A [`Flag`] is one atomic word. Its low 32 bits hold the value; the high bits say
//! whether the environment has been read yet and how many thread-scoped overrides are
//! alive anywhere. In the common case (environment read, no scoped override) reading a
//! flag is one relaxed atomic load.
//!
//! [`Flag::guard`] sets the process-wide value and restores it when the returned
//! [`Guard`] drops (also on early return and panic); [`Flag::guard_scoped`] overrides
//! the value for the current thread only and returns a [`ScopedGuard`]. Guards nest.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Once;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

/// Set until the flag's environment variable has been read.
const UNINIT: u64 = 1 << 32;
/// One live thread-scoped override anywhere in the process.
const SCOPED_ONE: u64 = 1 << 33;
const VALUE_MASK: u64 = u32::MAX as u64;

/// A value that a [`Flag`] can hold: it round-trips through 32 bits.
pub trait FlagValue: Copy + PartialEq + fmt::Display + fmt::Debug + Send + Sync + 'static {
    /// Encodes the value.
    fn to_bits(self) -> u32;
    /// Decodes a value written by [`FlagValue::to_bits`].
    fn from_bits(bits: u32) -> Self;
    /// The value in the JSON report of `backends info --json`.
    fn to_json(self) -> serde_json::Value {
        serde_json::Value::String(self.to_string())
    }
}

impl FlagValue for bool {
    fn to_bits(self) -> u32 {
        self as u32
    }
    fn from_bits(bits: u32) -> Self {
        bits != 0
    }
    fn to_json(self) -> serde_json::Value {
        self.into()
    }
}

impl FlagValue for u32 {
    fn to_bits(self) -> u32 {
        self
    }
    fn from_bits(bits: u32) -> Self {
        bits
    }
    fn to_json(self) -> serde_json::Value {
        self.into()
    }
}

/// Where a flag's process-wide value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagSource {
    /// The built-in default.
    Default,
    /// The named environment variable, read once at first use.
    Env(&'static str),
    /// A setter or a guard in this process.
    Set,
}

impl fmt::Display for FlagSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlagSource::Default => f.write_str("default"),
            FlagSource::Env(var) => write!(f, "env {var}"),
            FlagSource::Set => f.write_str("set"),
        }
    }
}

const SOURCE_DEFAULT: u8 = 0;
const SOURCE_ENV: u8 = 1;
const SOURCE_SET: u8 = 2;

/// How a flag reads its initial value from the environment.
pub struct EnvInit<T> {
    /// The variable's name.
    pub var: &'static str,
    /// Turns the variable's text into a value; `None` keeps the default.
    pub parse: fn(&str) -> Option<T>,
}

/// The untyped state of a flag: what guards save and restore.
pub struct RawFlag {
    word: AtomicU64,
    source: AtomicU8,
    init: Once,
}

impl RawFlag {
    fn store_bits(&self, bits: u32) {
        // Only the value bits change; the scoped-override count may move concurrently.
        let _ = self.word.fetch_update(Relaxed, Relaxed, |w| {
            Some((w & !VALUE_MASK) | u64::from(bits))
        });
    }

    fn bits(&self) -> u32 {
        (self.word.load(Relaxed) & VALUE_MASK) as u32
    }

    fn id(&'static self) -> usize {
        self as *const RawFlag as usize
    }
}

/// A typed, process-wide flag with an optional environment initialiser.
pub struct Flag<T: FlagValue> {
    name: &'static str,
    default: T,
    env: Option<EnvInit<T>>,
    raw: RawFlag,
}

impl<T: FlagValue> Flag<T> {
    /// A flag called `name` (PyTorch's dotted path) with a default and an optional
    /// environment variable that sets its initial value.
    pub const fn new(name: &'static str, default: T, env: Option<EnvInit<T>>) -> Self {
        // `to_bits` is not const; the default is written on first use instead.
        Flag {
            name,
            default,
            env,
            raw: RawFlag {
                word: AtomicU64::new(UNINIT),
                source: AtomicU8::new(SOURCE_DEFAULT),
                init: Once::new(),
            },
        }
    }

    /// PyTorch's dotted name of the flag, e.g. `cuda.matmul.allow_tf32`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The built-in default value.
    pub fn default_value(&self) -> T {
        self.default
    }

    /// The value in force on this thread: its innermost scoped override, else the
    /// process-wide value.
    #[inline]
    pub fn get(&'static self) -> T {
        let word = self.raw.word.load(Relaxed);
        if word >> 32 == 0 {
            return T::from_bits(word as u32);
        }
        self.get_slow()
    }

    #[cold]
    fn get_slow(&'static self) -> T {
        self.ensure_init();
        if self.raw.word.load(Relaxed) >= SCOPED_ONE
            && let Some(bits) = scoped_lookup(self.raw.id())
        {
            return T::from_bits(bits);
        }
        T::from_bits(self.raw.bits())
    }

    /// The process-wide value, ignoring this thread's scoped overrides.
    pub fn global(&'static self) -> T {
        self.ensure_init();
        T::from_bits(self.raw.bits())
    }

    /// Sets the process-wide value.
    pub fn set(&'static self, value: T) {
        self.ensure_init();
        self.raw.store_bits(value.to_bits());
        self.raw.source.store(SOURCE_SET, Relaxed);
    }

    /// Sets the process-wide value and returns the one it replaced (PyTorch's `set_flags`).
    pub fn replace(&'static self, value: T) -> T {
        let previous = self.global();
        self.set(value);
        previous
    }

    /// Where the process-wide value came from.
    pub fn source(&'static self) -> FlagSource {
        self.ensure_init();
        match self.raw.source.load(Relaxed) {
            SOURCE_ENV => FlagSource::Env(self.env.as_ref().map_or("", |e| e.var)),
            SOURCE_SET => FlagSource::Set,
            _ => FlagSource::Default,
        }
    }

    /// Sets the process-wide value until the returned guard drops.
    #[must_use = "the previous value comes back when the guard drops"]
    pub fn guard(&'static self, value: T) -> Guard {
        let mut guard = Guard::default();
        guard.push(self, value);
        guard
    }

    /// Overrides the value for the current thread until the returned guard drops.
    #[must_use = "the override ends when the guard drops"]
    pub fn guard_scoped(&'static self, value: T) -> ScopedGuard {
        let mut guard = ScopedGuard::default();
        guard.push(self, value);
        guard
    }

    /// This flag's entry in the `backends info` report: value and source.
    pub fn report(&'static self) -> serde_json::Value {
        serde_json::json!({ "value": self.get().to_json(), "source": self.source().to_string() })
    }

    fn ensure_init(&'static self) {
        self.raw.init.call_once(|| {
            let mut value = self.default;
            if let Some(env) = &self.env
                && let Ok(text) = std::env::var(env.var)
            {
                match (env.parse)(text.trim()) {
                    Some(parsed) => {
                        value = parsed;
                        self.raw.source.store(SOURCE_ENV, Relaxed);
                    }
                    None => log::debug!(
                        "{}={text:?} does not change {}; keeping {}",
                        env.var,
                        self.name,
                        self.default
                    ),
                }
            }
            self.raw.store_bits(value.to_bits());
            self.raw.word.fetch_and(!UNINIT, Relaxed);
        });
    }
}

/// Restores the process-wide values of one or more flags when dropped.
#[derive(Default)]
#[must_use = "the previous values come back when the guard drops"]
pub struct Guard {
    saved: Vec<(&'static RawFlag, u32, u8)>,
}

/// What both guard kinds do: take on one more flag setting, undone when the guard drops.
/// Functions that set several flags at once are written once, generic over the kind.
pub trait FlagGuard: Default {
    /// Sets `flag` to `value` for the guard's lifetime; settings are undone in reverse order.
    fn push<T: FlagValue>(&mut self, flag: &'static Flag<T>, value: T);
}

impl FlagGuard for Guard {
    fn push<T: FlagValue>(&mut self, flag: &'static Flag<T>, value: T) {
        flag.ensure_init();
        let raw = &flag.raw;
        self.saved.push((raw, raw.bits(), raw.source.load(Relaxed)));
        flag.set(value);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for (raw, bits, source) in self.saved.drain(..).rev() {
            raw.store_bits(bits);
            raw.source.store(source, Relaxed);
        }
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("flags", &self.saved.len())
            .finish()
    }
}

struct Override {
    flag: usize,
    token: u64,
    bits: u32,
}

thread_local! {
    static OVERRIDES: RefCell<Vec<Override>> = const { RefCell::new(Vec::new()) };
    static NEXT_TOKEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn scoped_lookup(flag: usize) -> Option<u32> {
    OVERRIDES
        .try_with(|o| {
            o.borrow()
                .iter()
                .rev()
                .find(|e| e.flag == flag)
                .map(|e| e.bits)
        })
        .ok()
        .flatten()
}

/// Ends thread-scoped overrides of one or more flags when dropped. It belongs to the
/// thread that made it (it is neither `Send` nor `Sync`).
#[derive(Default)]
#[must_use = "the override ends when the guard drops"]
pub struct ScopedGuard {
    entries: Vec<(&'static RawFlag, u64)>,
    _not_send: PhantomData<*const ()>,
}

impl FlagGuard for ScopedGuard {
    fn push<T: FlagValue>(&mut self, flag: &'static Flag<T>, value: T) {
        flag.ensure_init();
        let token = NEXT_TOKEN.with(|t| {
            let token = t.get();
            t.set(token + 1);
            token
        });
        let id = flag.raw.id();
        OVERRIDES.with(|o| {
            o.borrow_mut().push(Override {
                flag: id,
                token,
                bits: value.to_bits(),
            });
        });
        flag.raw.word.fetch_add(SCOPED_ONE, Relaxed);
        self.entries.push((&flag.raw, token));
    }
}

impl Drop for ScopedGuard {
    fn drop(&mut self) {
        for (raw, token) in self.entries.drain(..).rev() {
            let _ = OVERRIDES.try_with(|o| {
                let mut o = o.borrow_mut();
                if let Some(at) = o.iter().rposition(|e| e.token == token) {
                    o.remove(at);
                }
            });
            raw.word.fetch_sub(SCOPED_ONE, Relaxed);
        }
    }
}

impl fmt::Debug for ScopedGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedGuard")
            .field("flags", &self.entries.len())
            .finish()
    }
}

/// Declares a string-valued option: an enum whose `FromStr` accepts exactly PyTorch's
/// spellings (case-insensitive, plus listed aliases) and whose `Display` gives the first
/// spelling back. An unknown spelling is [`crate::Error::UnknownOption`], listing the
/// accepted values.
macro_rules! option_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $spelling:literal $(| $alias:literal)* ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// PyTorch's spelling of this value.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $spelling),+ }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::Error;
            fn from_str(text: &str) -> ::std::result::Result<Self, Self::Err> {
                $(
                    if text.eq_ignore_ascii_case($spelling) $(|| text.eq_ignore_ascii_case($alias))* {
                        return Ok($name::$variant);
                    }
                )+
                Err($crate::Error::UnknownOption {
                    option: $what,
                    got: text.to_string(),
                    accepted: vec![$($spelling $(, $alias)*),+].join(", "),
                })
            }
        }

        impl $crate::core::flag::FlagValue for $name {
            fn to_bits(self) -> u32 {
                self as u32
            }
            fn from_bits(bits: u32) -> Self {
                Self::ALL.get(bits as usize).copied().unwrap_or(Self::ALL[0])
            }
        }
    };
}
pub(crate) use option_enum;

#[cfg(test)]
mod tests {
    use super::*;

    static PLAIN: Flag<bool> = Flag::new("test.plain", true, None);
    static COUNT: Flag<u32> = Flag::new("test.count", 10, None);

    #[test]
    fn set_get_and_source() {
        static F: Flag<u32> = Flag::new("test.source", 3, None);
        assert_eq!(F.get(), 3);
        assert_eq!(F.source(), FlagSource::Default);
        F.set(4);
        assert_eq!((F.get(), F.source()), (4, FlagSource::Set));
        assert_eq!(F.replace(5), 4);
        assert_eq!(F.get(), 5);
    }

    #[test]
    fn guards_nest_and_restore_in_order() {
        let before = COUNT.get();
        {
            let _a = COUNT.guard(20);
            assert_eq!(COUNT.get(), 20);
            {
                let _b = COUNT.guard(30);
                assert_eq!(COUNT.get(), 30);
            }
            assert_eq!(COUNT.get(), 20);
        }
        assert_eq!(COUNT.get(), before);
    }

    #[test]
    fn scoped_override_is_thread_local_and_nests() {
        let _g = PLAIN.guard_scoped(false);
        assert!(!PLAIN.get());
        assert!(PLAIN.global());
        {
            let _h = PLAIN.guard_scoped(true);
            assert!(PLAIN.get());
        }
        assert!(!PLAIN.get());
        std::thread::spawn(|| assert!(PLAIN.get())).join().unwrap();
    }

    #[test]
    fn scoped_guards_dropped_out_of_order_end_their_own_override() {
        static F: Flag<u32> = Flag::new("test.order", 0, None);
        let a = F.guard_scoped(1);
        let b = F.guard_scoped(2);
        drop(a);
        assert_eq!(F.get(), 2);
        drop(b);
        assert_eq!(F.get(), 0);
    }
}
