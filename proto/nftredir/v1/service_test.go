package nftredirv1

import "testing"

func TestServiceNameIsTheDescriptors(t *testing.T) {
	if got := RedirectService_ServiceDesc.ServiceName; got != ServiceName {
		t.Fatalf("ServiceDesc names %q, ServiceName is %q", got, ServiceName)
	}
	svc := File_nftredir_v1_nftredir_proto.Services().ByName("RedirectService")
	if svc == nil || string(svc.FullName()) != ServiceName {
		t.Fatalf("the file descriptor's service is %v, want %q", svc, ServiceName)
	}
}
