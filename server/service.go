package server

import (
	"context"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

var _ nftredirv1.RedirectServiceServer = (*Server)(nil)

// Every call is refused until the startup reconcile is done: answering
// against records not yet checked with the kernel could acknowledge a
// state that is not there.
func (s *Server) checkReady() error {
	if !s.ready.Load() {
		return errNotReady
	}
	return nil
}

// AddPod enrols a pod or re-applies its enrolment.
func (s *Server) AddPod(ctx context.Context, req *nftredirv1.AddPodRequest) (*nftredirv1.AddPodResponse, error) {
	if err := s.checkReady(); err != nil {
		return nil, err
	}
	logging.AddFields(ctx, logging.Fields{"pod", req.GetPodUid(), "netns", req.GetNetnsPath()})
	resp, err := s.pods.AddPod(ctx, req)
	return resp, toStatus(err)
}

// RemovePod releases a pod; unknown pods and vanished namespaces are fine.
func (s *Server) RemovePod(ctx context.Context, req *nftredirv1.RemovePodRequest) (*nftredirv1.RemovePodResponse, error) {
	if err := s.checkReady(); err != nil {
		return nil, err
	}
	logging.AddFields(ctx, logging.Fields{"pod", req.GetPodUid()})
	existed, err := s.pods.RemovePod(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return &nftredirv1.RemovePodResponse{Existed: existed}, nil
}

// GetPod returns the record and a live comparison with the kernel.
func (s *Server) GetPod(ctx context.Context, req *nftredirv1.GetPodRequest) (*nftredirv1.GetPodResponse, error) {
	if err := s.checkReady(); err != nil {
		return nil, err
	}
	logging.AddFields(ctx, logging.Fields{"pod", req.GetPodUid()})
	resp, err := s.pods.GetPod(ctx, req.GetPodUid())
	return resp, toStatus(err)
}

// ListPods returns every record, without entering any namespace.
func (s *Server) ListPods(ctx context.Context, _ *nftredirv1.ListPodsRequest) (*nftredirv1.ListPodsResponse, error) {
	if err := s.checkReady(); err != nil {
		return nil, err
	}
	resp, err := s.pods.ListPods()
	return resp, toStatus(err)
}

// WatchPods sends the current set, a snapshot marker, then live events.
func (s *Server) WatchPods(_ *nftredirv1.WatchPodsRequest, stream grpc.ServerStreamingServer[nftredirv1.WatchPodsResponse]) error {
	if err := s.checkReady(); err != nil {
		return err
	}
	release, err := s.watchSlot(stream.Context())
	if err != nil {
		return err
	}
	defer release()
	sub, first, err := s.pods.Watch()
	if err != nil {
		return toStatus(err)
	}
	defer s.pods.Unwatch(sub)
	return streamWatch(sub, stream, first)
}
