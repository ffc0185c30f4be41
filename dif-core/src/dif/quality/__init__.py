"""The media gate of `dif quality`: decoding and sanity, PSNR / SSIM / SNR against a reference
(`dif.quality.metrics`), recorded human reviews and the verdict (`dif.quality.assess`)."""
