package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"slices"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	reflectiongrpc "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionalphagrpc "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/nftredir/nftredir/internal/calltrace"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// traceInterceptor gives each unary call a trace of its phases
// (calltrace), which its request log line reports.
func traceInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, _ = calltrace.New(ctx)
	return h(ctx, req)
}

// MaxRecvMsgSize bounds a request: the largest valid AddPod is a few KiB,
// and a local caller must not make the daemon buffer megabytes.
const MaxRecvMsgSize = 64 << 10

// MaxHeaderListSize bounds a request's header block, which grpc reads
// before any interceptor (auth included) runs: gRPC's own headers take a
// few hundred bytes, and grpc's default of 16 MiB let 20 callers make the
// daemon hold 230 MB.
const MaxHeaderListSize = 16 << 10

// maxStreams bounds one connection's concurrent calls; a client with more
// waits for a slot. With the fixed 64 KiB windows below, it also bounds
// what one connection can make the daemon buffer.
const maxStreams = 32

// NewGRPCServer builds the gRPC server with RedirectService, health and
// (if configured) reflection registered, and the interceptor chain:
// logging (not for health checks), peer-credential auth, then panic
// recovery innermost, so a panicking handler's Internal status is what
// the logging interceptor records. Config's interceptors come first.
func (s *Server) NewGRPCServer() *grpc.Server {
	reqLog := s.log.Named("grpc")
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		// The call's phases (calltrace) are read when it finishes: the
		// trace interceptor below put an empty trace in its context.
		logging.WithFieldsFromContext(func(ctx context.Context) logging.Fields {
			return append(peerFields(ctx), calltrace.From(ctx).Fields()...)
		}),
	}
	notHealth := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.Service != healthgrpc.Health_ServiceDesc.ServiceName
	})
	recoverOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		s.log.Error("panic in request handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return errPanicked
	})
	gs := grpc.NewServer(
		grpc.Creds(PeerCredentials{}),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		grpc.MaxConcurrentStreams(maxStreams),
		// Fixed receive windows: grpc would otherwise grow them (BDP
		// estimation) up to 16 MiB per connection for a fast sender, which
		// requests of a few KiB never need.
		grpc.InitialWindowSize(64<<10),
		grpc.InitialConnWindowSize(64<<10),
		// Node proxies keep WatchPods open for days; let them ping often
		// enough to notice a hung daemon, but not flood it (a peer pinging
		// faster is sent GOAWAY). A connection without calls for
		// MaxConnectionIdle is closed, freeing its slot; clients reconnect
		// transparently.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second, MaxConnectionIdle: 5 * time.Minute}),
		// The handshake reads a socket option; anything slower is a stuck peer.
		grpc.ConnectionTimeout(5*time.Second),
		grpc.ChainUnaryInterceptor(append(slices.Clip(s.unaryInterceptors),
			traceInterceptor,
			selector.UnaryServerInterceptor(logging.UnaryServerInterceptor(InterceptorLogger(reqLog), logOpts...), notHealth),
			s.allow.unaryInterceptor(),
			recovery.UnaryServerInterceptor(recoverOpt),
		)...),
		grpc.ChainStreamInterceptor(append(slices.Clip(s.streamInterceptors),
			selector.StreamServerInterceptor(logging.StreamServerInterceptor(InterceptorLogger(reqLog), logOpts...), notHealth),
			s.allow.streamInterceptor(),
			recovery.StreamServerInterceptor(recoverOpt),
		)...),
	)
	nftredirv1.RegisterRedirectServiceServer(gs, s)
	healthgrpc.RegisterHealthServer(gs, s.health)
	if s.reflect {
		s.registerReflection(gs)
	}
	return gs
}

// registerReflection serves reflection (v1 and the v1alpha that older
// tools ask for) from descriptors that keep the API's comments, so
// `grpcurl describe` shows its documentation.
func (s *Server) registerReflection(gs *grpc.Server) {
	resolver, err := nftredirv1.DocumentedResolver()
	if err != nil {
		s.log.Warn("serving reflection without API comments", "error", err)
		reflection.Register(gs)
		return
	}
	opts := reflection.ServerOptions{Services: gs, DescriptorResolver: resolver, ExtensionResolver: protoregistry.GlobalTypes}
	reflectiongrpc.RegisterServerReflectionServer(gs, reflection.NewServerV1(opts))
	reflectionalphagrpc.RegisterServerReflectionServer(gs, reflection.NewServer(opts))
}

func (s *Server) setServing(on bool) {
	st := healthgrpc.HealthCheckResponse_NOT_SERVING
	if on {
		st = healthgrpc.HealthCheckResponse_SERVING
	}
	s.ready.Store(on)
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(nftredirv1.ServiceName, st)
}

// Run serves on lis until ctx ends: it answers health (NOT_SERVING) at
// once, reconciles every record, turns SERVING, and reconciles again every
// interval. When ctx ends it turns NOT_SERVING, ends watches, and stops
// gracefully, cancelling whatever is still running after shutdownTimeout.
// It never touches pods' rules on the way out: capture must outlive the
// daemon.
func (s *Server) Run(ctx context.Context, lis net.Listener, shutdownTimeout time.Duration) error {
	gs := s.NewGRPCServer()
	serveErr := make(chan error, 1)
	go func() { serveErr <- gs.Serve(s.limitListener(lis)) }()

	loopCtx, stopLoop := context.WithCancel(ctx)
	loopDone := make(chan error, 1)
	go func() { loopDone <- s.reconcileLoop(loopCtx) }()

	var err error
	select {
	case <-ctx.Done():
	case err = <-loopDone:
		loopDone <- nil
	case err = <-serveErr:
		serveErr <- nil
	}
	stopLoop()
	<-loopDone
	s.shutdown(gs, shutdownTimeout)
	if serr := <-serveErr; serr != nil && !errors.Is(serr, grpc.ErrServerStopped) && err == nil {
		err = serr
	}
	return err
}

// reconcileLoop runs the startup reconcile and the BeforeServing hook,
// turns SERVING, then repeats the reconcile every interval. Only a failure
// of the startup pass (an unreadable state directory) or of the hook is
// returned: serving without knowing the enrolled pods would acknowledge
// requests against a state we cannot see.
func (s *Server) reconcileLoop(ctx context.Context) error {
	if _, err := s.pods.Reconcile(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("startup reconcile: %w", err)
	}
	if ctx.Err() != nil {
		return nil
	}
	if s.beforeServing != nil {
		if err := s.beforeServing(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("before serving: %w", err)
		}
	}
	s.setServing(true)
	s.log.Info("serving")
	if s.interval < 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := s.pods.Reconcile(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("periodic reconcile failed", "error", err)
			}
		}
	}
}

func (s *Server) shutdown(gs *grpc.Server, timeout time.Duration) {
	s.log.Info("stopping")
	s.setServing(false)
	// Health watches and WatchPods would hold GracefulStop forever.
	s.health.Shutdown()
	s.pods.CloseWatches()
	s.pods.StopTeardowns()
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		s.log.Warn("graceful stop timed out; cancelling remaining calls", "timeout", timeout)
		gs.Stop()
		<-done
	}
}
