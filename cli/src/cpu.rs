//! The processor must have the instruction sets the binary was compiled for: on x86-64 the
//! workspace builds for x86-64-v3 (AVX2, FMA; `.cargo/config.toml`), and on an older processor
//! the first such instruction would kill the process with SIGILL, somewhere, without a word.
//! Checked before anything else a binary does, with CPUID (not `is_x86_feature_detected!`,
//! which answers "yes" for every feature the build itself enables). A processor without AVX at
//! all still dies of SIGILL first: every vector move of this build, the check's own included, is
//! AVX-encoded.

/// Instruction sets this build uses that the processor lacks, by their `target_feature` names.
pub fn missing_features() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        missing_of(&x86::enabled(), x86::has)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// Prints what the processor lacks and exits with status 2, if it lacks anything: the first
/// thing each binary's `main` does, before any code that the compiler may have given wide
/// instructions (building the command line already has them).
pub fn exit_if_unsupported() {
    let missing = missing_features();
    if !missing.is_empty() {
        eprintln!("error: {}", unsupported_message(&missing));
        std::process::exit(2)
    }
}

/// The error line for [`missing_features`], naming the fix.
pub(crate) fn unsupported_message(missing: &[&str]) -> String {
    format!(
        "this processor lacks {} that this build of parakeet uses (built for x86-64-v3: AVX2 and \
         FMA, Intel Haswell / AMD Excavator and later, every AWS GPU instance); rebuild for it with \
         RUSTFLAGS=\"-C target-cpu=native\" cargo build --release",
        missing.join(", ")
    )
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn missing_of(enabled: &[&'static str], has: impl Fn(&str) -> bool) -> Vec<&'static str> {
    enabled.iter().copied().filter(|f| !has(f)).collect()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::__cpuid_count;

    /// One instruction set: its `target_feature` name, whether this build uses it, and which
    /// bit of which CPUID leaf reports it.
    struct Feature {
        name: &'static str,
        built_in: bool,
        leaf: u32,
        register: Reg,
        bit: u32,
    }

    macro_rules! features {
        ($($name:tt => $leaf:expr, $register:ident, $bit:expr;)*) => {
            [$(Feature {
                name: $name,
                built_in: cfg!(target_feature = $name),
                leaf: $leaf,
                register: Reg::$register,
                bit: $bit,
            }),*]
        };
    }

    /// x86-64-v2 and v3: the levels a build may target.
    const FEATURES: [Feature; 13] = features! {
        "sse3" => 1, Ecx, 0;
        "ssse3" => 1, Ecx, 9;
        "fma" => 1, Ecx, 12;
        "sse4.1" => 1, Ecx, 19;
        "sse4.2" => 1, Ecx, 20;
        "movbe" => 1, Ecx, 22;
        "popcnt" => 1, Ecx, 23;
        "avx" => 1, Ecx, 28;
        "f16c" => 1, Ecx, 29;
        "bmi1" => 7, Ebx, 3;
        "avx2" => 7, Ebx, 5;
        "bmi2" => 7, Ebx, 8;
        "lzcnt" => 0x8000_0001, Ecx, 5;
    };

    /// The features this build was compiled with.
    pub(super) fn enabled() -> Vec<&'static str> {
        FEATURES
            .iter()
            .filter(|f| f.built_in)
            .map(|f| f.name)
            .collect()
    }

    /// Whether the processor reports `feature`.
    pub(super) fn has(feature: &str) -> bool {
        let Some(f) = FEATURES.iter().find(|f| f.name == feature) else {
            return false;
        };
        let highest = __cpuid_count(f.leaf & 0x8000_0000, 0).eax;
        if highest < f.leaf {
            return false;
        }
        let r = __cpuid_count(f.leaf, 0);
        let value = match f.register {
            Reg::Ebx => r.ebx,
            Reg::Ecx => r.ecx,
        };
        // AVX-encoded instructions also need the operating system to save the wide registers:
        // OSXSAVE (leaf 1, ECX bit 27) says it manages the extended state at all.
        let needs_os_state = matches!(feature, "avx" | "avx2" | "fma" | "f16c");
        value & (1 << f.bit) != 0 && (!needs_os_state || __cpuid_count(1, 0).ecx & (1 << 27) != 0)
    }

    enum Reg {
        Ebx,
        Ecx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_each_enabled_feature_the_processor_lacks() {
        let missing = missing_of(&["avx", "avx2", "fma"], |f| f == "avx");
        assert_eq!(missing, ["avx2", "fma"]);
        let line = unsupported_message(&missing);
        assert!(
            line.contains("avx2, fma") && line.contains("RUSTFLAGS"),
            "{line}"
        );
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn cpuid_reads_what_the_standard_library_reads() {
        // Features the build enables are present (this test runs their instructions); for the
        // others `is_x86_feature_detected!` asks the processor, and both readings must agree.
        macro_rules! agree {
            ($($name:tt),*) => { $(
                let expected = cfg!(target_feature = $name)
                    || std::arch::is_x86_feature_detected!($name);
                assert_eq!(x86::has($name), expected, $name);
            )* };
        }
        agree!(
            "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2",
            "f16c", "lzcnt", "movbe"
        );
        assert!(missing_features().is_empty());
    }
}
