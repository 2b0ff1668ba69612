//! The processor must have the instruction sets the binary was compiled for: on x86-64 the
//! workspace builds for x86-64-v3 (AVX2, FMA; `.cargo/config.toml`), and on an older processor
//! the first such instruction would kill the process with SIGILL, somewhere, without a word.
//! Checked before anything else a binary does, with CPUID (not `is_x86_feature_detected!`,
//! which answers "yes" for every feature the build itself enables).

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

    /// The features of x86-64-v2 and v3 that this build was compiled with.
    pub(super) fn enabled() -> Vec<&'static str> {
        let mut on = Vec::new();
        macro_rules! enabled {
            ($($name:tt),*) => { $( if cfg!(target_feature = $name) { on.push($name); } )* };
        }
        enabled!(
            "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2",
            "f16c", "lzcnt", "movbe"
        );
        on
    }

    /// Whether the processor reports `feature` (leaf 1, leaf 7 and leaf 0x80000001 bits).
    pub(super) fn has(feature: &str) -> bool {
        let (leaf, register, bit) = match feature {
            "sse3" => (1, Reg::Ecx, 0),
            "ssse3" => (1, Reg::Ecx, 9),
            "fma" => (1, Reg::Ecx, 12),
            "sse4.1" => (1, Reg::Ecx, 19),
            "sse4.2" => (1, Reg::Ecx, 20),
            "movbe" => (1, Reg::Ecx, 22),
            "popcnt" => (1, Reg::Ecx, 23),
            "avx" => (1, Reg::Ecx, 28),
            "f16c" => (1, Reg::Ecx, 29),
            "bmi1" => (7, Reg::Ebx, 3),
            "avx2" => (7, Reg::Ebx, 5),
            "bmi2" => (7, Reg::Ebx, 8),
            "lzcnt" => (0x8000_0001, Reg::Ecx, 5),
            _ => return false,
        };
        let highest = __cpuid_count(leaf & 0x8000_0000, 0).eax;
        if highest < leaf {
            return false;
        }
        let r = __cpuid_count(leaf, 0);
        let value = match register {
            Reg::Ebx => r.ebx,
            Reg::Ecx => r.ecx,
        };
        // AVX-encoded instructions also need the operating system to save the wide registers:
        // OSXSAVE (leaf 1, ECX bit 27) says it manages the extended state at all.
        let needs_os_state = matches!(feature, "avx" | "avx2" | "fma" | "f16c");
        value & (1 << bit) != 0 && (!needs_os_state || __cpuid_count(1, 0).ecx & (1 << 27) != 0)
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
