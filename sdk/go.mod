module github.com/sandbot/sandbot/sdk

go 1.26.0
