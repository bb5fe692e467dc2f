#!/usr/bin/env bash
# Makes a CA and a serving certificate for the hami webhook service, and prints the
# kubectl commands that install them. Usage: gen-webhook-certs.sh [OUT_DIR] [NAMESPACE]
# Only for scheduler.webhook.tls_mode: files (a certificate you manage yourself, mounted
# from the Secret). The default, tls_mode: self, makes, trusts and rotates its own
# (docs/operations.md, "Certificates"); cert-manager is the chart's other choice.
set -euo pipefail
out="${1:-./hami-certs}"
ns="${2:-hami-system}"
svc="hami-scheduler"
mkdir -p "$out"
cd "$out"
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=hami-webhook-ca" \
  -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=${svc}.${ns}.svc" \
  -keyout tls.key -out tls.csr 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.%s,DNS:%s.%s.svc,DNS:%s.%s.svc.cluster.local\n' \
  "$svc" "$svc" "$ns" "$svc" "$ns" "$svc" "$ns" > san.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
  -extfile san.ext -out tls.crt 2>/dev/null
echo "# install:"
echo "kubectl -n ${ns} create secret tls ${svc}-tls --cert=$PWD/tls.crt --key=$PWD/tls.key"
echo "kubectl patch mutatingwebhookconfiguration hami-webhook --type=json -p \\"
echo "  '[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$(base64 -w0 ca.crt)\"}]'"
