// Command grpc runs gRPC over Weft: a server and a client in one
// process, joined by an emulated NTB bridge instead of TCP, through
// sock.Listen (a net.Listener for grpc.Server.Serve) and sock.Dial (a
// custom dialer for grpc.NewClient). It makes unary calls and runs a
// bidirectional stream, and prints what it measured.
//
//	go run ./examples/grpc                 # from examples/grpc: go run .
//	go run . -backend ntb -addr /dev/shm/weft-grpc -calls 10000
//	go run . -backend tcp        # the same over TCP loopback, for reference
//
// # Settings
//
// A gRPC call hands off between about six goroutines (the caller, each
// side's reader and writer, the server's handler), and each side's
// reader waits in a Weft receive, which busy-polls for Options.Spin
// before it sleeps. Where the goroutines outnumber the cores, the polls
// take the cores the others need: on a 2-core host BenchmarkGRPC
// measured unary calls over ntb 1.2-1.6x faster, at half the CPU time a
// call, with receives that sleep at once (-spin=-1ns here,
// sock.Config{Options: fabric.Options{Spin: -1}} in a program) than with
// the default budget; 1 MiB streams went either way, with the load of
// other processes. gRPC's own buffer and window options
// (WithWriteBufferSize, WithReadBufferSize, WithInitialWindowSize and
// their server twins) changed neither the CPU time per MiB nor the rate
// over ntb or TCP: gRPC's copies of each message (protobuf's marshal and
// unmarshal, its write buffer, its read assembly) cost about 3 times what
// the transport does, so the defaults stay. BenchmarkGRPC's -window and
// -buffer flags try them.
//
// The example is a module of its own, so that the SDK does not depend on
// gRPC. The service is described by hand (no protoc): Echo is unary,
// Chat a bidirectional stream, both on wrapperspb.BytesValue messages and
// the default protobuf codec.
package main

import (
	"context"
	"errors"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weft-io/weft/fabric/sock"
)

// echoServer implements the service: Echo returns its request, Chat
// answers every message of the stream with the same bytes.
type echoServer struct{}

func (echoServer) echo(_ context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	return in, nil
}

func (echoServer) chat(stream grpc.ServerStream) error {
	for {
		var m wrapperspb.BytesValue
		if err := stream.RecvMsg(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := stream.SendMsg(&m); err != nil {
			return err
		}
	}
}

// serviceDesc is what protoc-gen-go-grpc would generate for
//
//	service Echo {
//	  rpc Echo(google.protobuf.BytesValue) returns (google.protobuf.BytesValue);
//	  rpc Chat(stream google.protobuf.BytesValue) returns (stream google.protobuf.BytesValue);
//	}
var serviceDesc = grpc.ServiceDesc{
	ServiceName: "weft.example.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(echoServer).echo(ctx, in)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Chat",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(echoServer).chat(stream)
		},
	}},
}

// serve starts a gRPC server of the Echo service on a Weft listener.
func serve(l net.Listener) *grpc.Server {
	s := newServer()
	go s.Serve(l)
	return s
}

// newServer returns a gRPC server of the Echo service, not yet serving.
func newServer(opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(opts...)
	s.RegisterService(&serviceDesc, echoServer{})
	return s
}

// dial returns a gRPC client connection whose transport is a Weft
// connection to addr of the backend (backend "tcp": a TCP connection, the
// reference).
func dial(backend, addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///weft", append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if backend == "tcp" {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			}
			return sock.Dial(ctx, backend, addr, config)
		})}, opts...)...)
}

// callEcho makes one unary call.
func callEcho(ctx context.Context, cc *grpc.ClientConn, b []byte) ([]byte, error) {
	out := new(wrapperspb.BytesValue)
	if err := cc.Invoke(ctx, "/weft.example.Echo/Echo", wrapperspb.Bytes(b), out); err != nil {
		return nil, err
	}
	return out.Value, nil
}

// openChat starts a bidirectional stream.
func openChat(ctx context.Context, cc *grpc.ClientConn) (grpc.ClientStream, error) {
	return cc.NewStream(ctx, &serviceDesc.Streams[0], "/weft.example.Echo/Chat")
}

// listen starts a Weft listener for the server (backend "tcp": a TCP
// listener on loopback, the reference).
func listen(ctx context.Context, backend, addr string) (net.Listener, error) {
	if backend == "tcp" {
		var lc net.ListenConfig
		return lc.Listen(ctx, "tcp", "127.0.0.1:0")
	}
	return sock.Listen(ctx, backend, addr, config)
}

// config configures the Weft connections of both sides (nil: defaults).
var config *sock.Config
