module github.com/weft-io/weft

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/gaissmai/bart v0.30.0
	github.com/jsimonetti/rtnetlink/v2 v2.3.0
	github.com/mdlayher/netlink v1.9.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/net v0.63.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/mdlayher/socket v0.5.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.25.0 // indirect
)
