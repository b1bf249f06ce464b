#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| drivelab_fuzz::scenario::scenario(data));
