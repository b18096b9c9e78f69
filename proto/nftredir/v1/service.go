package nftredirv1

// ServiceName is the RedirectService's full name, which is also its
// grpc.health.v1 service name. It is a constant, unlike the generated
// RedirectService_ServiceDesc.ServiceName, so callers can name the
// service without the descriptor; service_test.go holds the two equal.
const ServiceName = "nftredir.v1.RedirectService"
