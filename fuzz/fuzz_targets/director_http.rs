#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| drivelab_fuzz::fakes::director_http(data));
