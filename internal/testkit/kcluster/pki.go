package kcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's one CA and what it issues. ECDSA P-256 throughout:
// key generation is instant, where RSA would cost seconds of start-up.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	caPath string
}

// keyPair is an issued certificate and its key, as files and as PEM.
type keyPair struct {
	certPath, keyPath string
	certPEM, keyPEM   []byte
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kcluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, ca: ca, caKey: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	p.caPath = filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(p.caPath, p.caPEM, 0o644); err != nil {
		return nil, err
	}
	keyPEM, err := ecKeyPEM(key)
	if err != nil {
		return nil, err
	}
	return p, os.WriteFile(filepath.Join(dir, "ca.key"), keyPEM, 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

func ecKeyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// issue signs a certificate for name: a client certificate with cn and
// orgs (the user and groups Kubernetes authenticates), and a server one
// too when ips or dns are given.
func (p *pki) issue(name, cn string, orgs []string, ips []net.IP, dns []string) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	if len(ips) > 0 || len(dns) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return keyPair{}, fmt.Errorf("issue %s: %w", name, err)
	}
	kp := keyPair{
		certPath: filepath.Join(p.dir, name+".crt"),
		keyPath:  filepath.Join(p.dir, name+".key"),
		certPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}
	if kp.keyPEM, err = ecKeyPEM(key); err != nil {
		return keyPair{}, err
	}
	if err := os.WriteFile(kp.certPath, kp.certPEM, 0o644); err != nil {
		return keyPair{}, err
	}
	return kp, os.WriteFile(kp.keyPath, kp.keyPEM, 0o600)
}

// serviceAccountKey writes the key pair that signs ServiceAccount tokens:
// the apiserver signs (TokenRequest, projected tokens) and verifies with
// it, the controller-manager signs the legacy token Secrets with it.
func (p *pki) serviceAccountKey() (priv, pub string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	keyPEM, err := ecKeyPEM(key)
	if err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	priv, pub = filepath.Join(p.dir, "sa.key"), filepath.Join(p.dir, "sa.pub")
	if err := os.WriteFile(priv, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	return priv, pub, os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
}
