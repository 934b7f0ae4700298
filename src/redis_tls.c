/* SPDX-License-Identifier: MIT */
/*
 * src/redis_tls.c - TLS for the Redis client (rediss://) with OpenSSL
 * (src/redis_client_impl.h says which file does what): the context made
 * at open, the handshake of each connection, and TLS reads and writes.
 *
 * The context: TLS 1.2 or later; the server's certificate verified
 * against the CA file or directory (cfg.redis_tls_ca_file / _ca_dir),
 * else the system store; an optional client certificate and key (both or
 * neither). The handshake (src/redis_connect.c calls it on every
 * connection to a data node): SNI, and the certificate checked against
 * the host name, or the IP address, or cfg.redis_tls_server_name when
 * set. Its failures say which: a certificate that is not trusted, one
 * that does not match the name, a server that asks for a client
 * certificate, a port that does not speak TLS.
 *
 * A build without OpenSSL (TWHEEL_HAVE_TLS undefined) keeps only
 * tw__rc_tls_setup(), which refuses rediss:// with the reason. The
 * context is read-only after open (the name to check,
 * cfg.redis_tls_server_name, is taken by src/redis_client.c); a session (SSL)
 * belongs to its connection, used by one thread at a time.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <stdio.h>
#include <string.h>

#ifdef TWHEEL_HAVE_TLS
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

#include "common.h"
#include "redis_client_impl.h"

#ifdef TWHEEL_HAVE_TLS
/* Why a TLS call failed, from OpenSSL's error queue and errno. */
static void tls_why(SSL *ssl, int r, const char *op, char *why, size_t wlen)
{
    int e = SSL_get_error(ssl, r);
    unsigned long q = ERR_peek_error();
    if (e == SSL_ERROR_ZERO_RETURN) {
        snprintf(why, wlen, "the server closed the TLS connection");
    } else if (q) {
        char b[200];
        ERR_error_string_n(q, b, sizeof b);
        const char *reason = ERR_reason_error_string(q);
        reason = reason ? reason : b;
        snprintf(why, wlen, "TLS %s failed: %s%s", op, reason,
                 strstr(reason, "certificate required")
                     ? " (the server asks for a client certificate)"
                     : "");
    } else if (e == SSL_ERROR_SYSCALL && errno && errno != EAGAIN) {
        tw__rc_io_why(errno, op, why, wlen);
    } else if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ||
               errno == EAGAIN) {
        snprintf(why, wlen, "TLS %s: no answer within %d ms%s", op, RC_IO_MS,
                 strcmp(op, "handshake") ? "" : " (not a TLS port?)");
    } else {
        snprintf(why, wlen, "TLS %s failed: the server closed the connection",
                 op);
    }
}

/* The TLS handshake on @k: SNI, the certificate checked against the
 * trusted CAs and against the host name (or IP address). */
int tw__rc_tls_start(tw__rc *c, struct rc_conn *k, const char *host, char *why,
                     size_t wlen)
{
    SSL *ssl = SSL_new(c->ssl_ctx);
    if (!ssl) {
        snprintf(why, wlen, "out of memory (TLS)");
        return TW_ENOMEM;
    }
    k->ssl = ssl;
    SSL_set_fd(ssl, k->fd);
    const char *name = c->server_name ? c->server_name : host;
    unsigned char ip[16];
    if (inet_pton(AF_INET, name, ip) == 1 ||
        inet_pton(AF_INET6, name, ip) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name);
    } else {
        SSL_set_tlsext_host_name(ssl, name);
        SSL_set1_host(ssl, name);
    }
    ERR_clear_error();
    int r = SSL_connect(ssl);
    if (r == 1)
        return 0;
    long v = SSL_get_verify_result(ssl);
    if (v == X509_V_ERR_HOSTNAME_MISMATCH ||
        v == X509_V_ERR_IP_ADDRESS_MISMATCH)
        snprintf(why, wlen,
                 "TLS: the server's certificate does not match the host "
                 "name \"%s\"",
                 name);
    else if (v != X509_V_OK)
        snprintf(why, wlen, "TLS: the server's certificate is not trusted (%s)",
                 X509_verify_cert_error_string(v));
    else
        tls_why(ssl, r, "handshake", why, wlen);
    return TW_ECONN;
}

/* One SSL_write of up to @n bytes: the count written, or -1 with @why. */
ssize_t tw__rc_tls_write(struct rc_conn *k, const char *p, size_t n, char *why,
                         size_t wlen)
{
    ERR_clear_error();
    int r = SSL_write(k->ssl, p, n > (1u << 30) ? 1 << 30 : (int)n);
    if (r > 0)
        return r;
    tls_why(k->ssl, r, "write", why, wlen);
    /* A server that refused us after the handshake (TLS 1.3: no or a bad
     * client certificate) sent an alert before it closed: its reason says
     * more than the reset. */
    char b[64];
    ERR_clear_error();
    int rr = SSL_read(k->ssl, b, sizeof b);
    if (rr <= 0 && ERR_peek_error())
        tls_why(k->ssl, rr, "write", why, wlen);
    return -1;
}

/* One SSL_read: the count read (at least one byte), or -1 with @why. */
ssize_t tw__rc_tls_read(struct rc_conn *k, char *p, size_t n, char *why,
                        size_t wlen)
{
    ERR_clear_error();
    int r = SSL_read(k->ssl, p, (int)n);
    if (r <= 0)
        tls_why(k->ssl, r, "read", why, wlen);
    return r <= 0 ? -1 : r;
}

/* The client certificate and its key into @x. */
static int tls_client_cert(tw__rc *c, SSL_CTX *x, const tw__rc_opts *o)
{
    char b[200];
    if (!o->tls_cert_file != !o->tls_key_file)
        return tw__rc_bad(c, "redis TLS: a client certificate needs both "
                             "redis_tls_cert_file and redis_tls_key_file");
    if (!o->tls_cert_file)
        return 0;
    if (SSL_CTX_use_certificate_chain_file(x, o->tls_cert_file) != 1) {
        ERR_error_string_n(ERR_get_error(), b, sizeof b);
        return tw__rc_bad(c,
                          "redis TLS: cannot load the certificate \"%s\": %s",
                          o->tls_cert_file, b);
    }
    if (SSL_CTX_use_PrivateKey_file(x, o->tls_key_file, SSL_FILETYPE_PEM) !=
            1 ||
        SSL_CTX_check_private_key(x) != 1) {
        ERR_error_string_n(ERR_get_error(), b, sizeof b);
        return tw__rc_bad(c, "redis TLS: cannot use the key \"%s\": %s",
                          o->tls_key_file, b);
    }
    return 0;
}

/* The context: trusted CAs, client certificate, TLS 1.2 or later. */
static int tls_context(tw__rc *c, const tw__rc_opts *o)
{
    SSL_CTX *x = SSL_CTX_new(TLS_client_method());
    if (!x)
        return TW_ENOMEM;
    c->ssl_ctx = x;
    SSL_CTX_set_min_proto_version(x, TLS1_2_VERSION);
    SSL_CTX_set_verify(x, SSL_VERIFY_PEER, NULL);
    char b[200];
    ERR_clear_error();
    if (o->tls_ca_file || o->tls_ca_dir) {
        if (SSL_CTX_load_verify_locations(x, o->tls_ca_file, o->tls_ca_dir) !=
            1) {
            ERR_error_string_n(ERR_get_error(), b, sizeof b);
            return tw__rc_bad(c, "redis TLS: cannot load the CAs of \"%s\": %s",
                              o->tls_ca_file ? o->tls_ca_file : o->tls_ca_dir,
                              b);
        }
    } else if (SSL_CTX_set_default_verify_paths(x) != 1) {
        return tw__rc_bad(c, "redis TLS: cannot load the system's CAs");
    }
    int rc = tls_client_cert(c, x, o);
    if (rc)
        return rc;
    ERR_clear_error();
    return 0;
}
#endif

/* The TLS context of a rediss:// address; TLS files with another address
 * are refused, and so is rediss:// in a build without OpenSSL. */
int tw__rc_tls_setup(tw__rc *c, const tw__rc_opts *o)
{
    bool files = o->tls_ca_file || o->tls_ca_dir || o->tls_cert_file ||
                 o->tls_key_file || o->tls_server_name;
    if (!c->tls)
        return files ? tw__rc_bad(c, "redis: TLS files are set but the "
                                     "address is not rediss://")
                     : 0;
#ifndef TWHEEL_HAVE_TLS
    return tw__rc_bad(c, "redis: rediss:// needs TLS, and this build of "
                         "twheel has none (OpenSSL was not found)");
#else
    return tls_context(c, o);
#endif
}

void tw__rc_tls_free(tw__rc *c)
{
#ifdef TWHEEL_HAVE_TLS
    if (c->ssl_ctx)
        SSL_CTX_free(c->ssl_ctx);
#else
    (void)c;
#endif
}
