module github.com/sandbot/sandbot/examples/wasi-command

go 1.26.0

require github.com/sandbot/sandbot/sdk v0.0.0

replace github.com/sandbot/sandbot/sdk => ../../sdk
