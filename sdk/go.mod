module github.com/sandbot/sandbot/sdk

go 1.26.0

require github.com/sandbot/sandbot v0.0.0

replace github.com/sandbot/sandbot => ../
