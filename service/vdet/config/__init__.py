"""The settings: one strict base (`base`), one module per section (`streams`, `ingest`, `gpu`,
`workers`, `notify`, ...) and `settings` (the whole `Settings`: defaults, then a YAML file, then
`VDET_*` variables; `load_settings` says what is wrong with a bad one). They describe and
validate; nothing here starts anything, and config imports only core."""
